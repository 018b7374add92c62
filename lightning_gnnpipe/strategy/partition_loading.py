"""Which partition of a graph partitioned offline a rank loads (:meth:`GraphChunkDataModule.from_partitions
<lightning_gnnpipe.GraphChunkDataModule.from_partitions>`), and when it lets go of its edge list.

* ``GNNPipeStrategy(graph_parallel_size=G)``: stage ``s`` of partition ``g`` loads partition ``g``; its features only
  at ``s = 0`` (the first stage reads them) or with ``G = 1`` (every stage may: the graph-parallel evaluation, GCNII's
  ``x0`` computed on each stage); with ``G = 1`` the edge list stays (the graph-parallel evaluation is built from it
  at the first evaluation), with ``G > 1`` it goes once the stages are built.
* ``GraphParallelStrategy``: rank ``g`` loads partition ``g`` with its features; the edge list goes after the build.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class PartitionToLoad(NamedTuple):
    """``partition``: the partition ``g``; ``features``: whether to load its feature rows; ``edges_after_build``:
    whether the rank reads its edge list again after the strategy built its chunk graphs."""

    partition: int
    features: bool
    edges_after_build: bool


class PartitionLoading:
    """Mixed into both strategies: :meth:`partition_to_load`, asked by the DataModule's ``setup`` in every rank."""

    def partition_to_load(self: Any) -> PartitionToLoad:
        """The partition this rank loads (module docstring)."""
        topology = getattr(self, "topology", None)  # GNNPipeStrategy's rank layout
        if topology is None:  # graph parallelism: rank g is partition g
            return PartitionToLoad(self.global_rank, True, False)
        first, one = topology.stage_index(self.global_rank) == 0, topology.graph_parallel_size == 1
        return PartitionToLoad(topology.partition_index(self.global_rank), first or one, one)


def release_partition_edges(strategy: Any, datamodule: Any) -> None:
    """After the build: let go of a loaded partition's edge list where the rank does not read it again (16 bytes an
    edge of private memory; :meth:`GraphChunkDataModule.release_edges
    <lightning_gnnpipe.GraphChunkDataModule.release_edges>`)."""
    if getattr(datamodule, "partitions", None) is not None and not strategy.partition_to_load().edges_after_build:
        datamodule.release_edges()
