"""Partitioned graphs: cut once offline (:func:`partition_graph`), each rank loads only its part
(:meth:`GraphChunkDataModule.from_partitions <lightning_gnnpipe.GraphChunkDataModule.from_partitions>`)."""

from lightning_gnnpipe.data.partitioned.layout import PartitionDirectory, read_meta
from lightning_gnnpipe.data.partitioned.read import load_partition, load_plan
from lightning_gnnpipe.data.partitioned.write import partition_graph

__all__ = ["PartitionDirectory", "load_partition", "load_plan", "partition_graph", "read_meta"]
