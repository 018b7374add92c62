"""lightning_gnnpipe: pipelined layer-level model parallelism for full-graph GNN training.

Implements GNNPipe (arXiv 2308.10087) as a PyTorch Lightning strategy. Pass
``GNNPipeStrategy()`` (or ``strategy="gnnpipe"``) to ``Trainer`` and the graph as a
``GraphChunkDataModule``.
"""

from lightning.pytorch.strategies import StrategyRegistry

from lightning_gnnpipe.data import ChunkPlan, GraphChunkDataModule, build_chunk_plan, metis_partition
from lightning_gnnpipe.data.partitioned import partition_graph
from lightning_gnnpipe.history.history import History
from lightning_gnnpipe.nn.stack import BlockStack, LayerStack, find_layer_stack
from lightning_gnnpipe.pipeline.schedule import SCHEDULES
from lightning_gnnpipe.comm.accounting import CommStats
from lightning_gnnpipe.strategy.gnnpipe import GNNPipeStrategy
from lightning_gnnpipe.strategy.graph_parallel import GraphParallelStrategy

__version__ = "0.1.0"

__all__ = [
    "ChunkPlan",
    "CommStats",
    "GNNPipeStrategy",
    "GraphChunkDataModule",
    "GraphParallelStrategy",
    "History",
    "LayerStack",
    "SCHEDULES",
    "build_chunk_plan",
    "BlockStack",
    "find_layer_stack",
    "metis_partition",
    "partition_graph",
]

for _strategy in (GNNPipeStrategy, GraphParallelStrategy):
    if _strategy.strategy_name not in StrategyRegistry:
        _strategy.register_strategies(StrategyRegistry)
