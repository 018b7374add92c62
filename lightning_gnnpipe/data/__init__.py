"""Graph side: METIS partition, chunks and halos, the DataModule."""

from lightning_gnnpipe.data.chunk import ChunkPlan, build_chunk_plan
from lightning_gnnpipe.data.datamodule import GraphChunkDataModule
from lightning_gnnpipe.data.partition import edge_cut, metis_partition

__all__ = [
    "ChunkPlan", "GraphChunkDataModule", "build_chunk_plan", "edge_cut", "metis_partition",
]
