"""The rank layout of pipeline and hybrid parallelism: ``G`` pipelines of ``S`` stages, ``v`` stages per rank.

Global rank ``g * S + s`` runs stage ``s`` of partition ``g``'s pipeline: a ``(G, S)`` device mesh with dimensions
``("partition", "stage")`` (``torch.distributed.device_mesh``). The ``S`` ranks of one pipeline pass activations
along the ``"stage"`` dimension; the ``G`` ranks of one stage exchange halo rows and sum weight gradients along
``"partition"``.

The mesh is built from process groups created with the strategy's exchange timeout (:func:`build_mesh`):
``init_device_mesh`` (torch 2.13) creates its sub-groups with the backend's default timeout (30 minutes for gloo)
unless private backend options are passed, and the package's exchanges must time out with the user's
``exchange_timeout``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from lightning_gnnpipe.pipeline.schedule import stage_ranks

MESH_DIMS = ("partition", "stage")
"""Names of the mesh dimensions, outer first."""


@dataclass(frozen=True)
class PipelineTopology:
    """Where every rank sits: pure rank arithmetic, valid before any process group exists.

    Attributes:
        world_size: ``P = S * G`` processes.
        graph_parallel_size: ``G`` pipelines (graph partitions).
        stages_per_rank: ``v`` (virtual) stages per rank.
        schedule: The schedule name (places the virtual stages on ranks, see
            :func:`~lightning_gnnpipe.pipeline.schedule.stage_ranks`).
    """

    world_size: int
    graph_parallel_size: int = 1
    stages_per_rank: int = 1
    schedule: str = "gpipe"

    @property
    def num_stages(self) -> int:
        """``S``: ranks per pipeline."""
        return self.world_size // self.graph_parallel_size

    @property
    def num_virtual_stages(self) -> int:
        """``S * v``: stages of the pipeline."""
        return self.num_stages * self.stages_per_rank

    def stage_index(self, global_rank: int) -> int:
        """``s``: the rank's position in its pipeline."""
        return global_rank % self.num_stages

    def partition_index(self, global_rank: int) -> int:
        """``g``: the rank's graph partition (its pipeline), 0 without hybrid parallelism."""
        return global_rank // self.num_stages

    def rank_of(self, global_rank: int, stage: int) -> int:
        """Global rank of position ``stage`` in the pipeline of ``global_rank``."""
        return self.partition_index(global_rank) * self.num_stages + stage

    @property
    def virtual_stage_ranks(self) -> List[int]:
        """Pipeline position of every virtual stage, ``S * v`` ints."""
        return stage_ranks(self.schedule, self.num_stages, self.stages_per_rank)

    def local_stages(self, global_rank: int) -> List[int]:
        """The virtual stages this rank runs, in pipeline order."""
        s = self.stage_index(global_rank)
        return [i for i, r in enumerate(self.virtual_stage_ranks) if r == s]

    def location(self, global_rank: int, layers: Optional[List[List[int]]] = None) -> str:
        """The rank's place, named in error notes: ``"rank r (stage s of S[, partition g of G][, layers [...]])"``;
        ``layers``: those of every pipeline position, once known."""
        s = self.stage_index(global_rank)
        parts = [f"stage {s} of {self.num_stages}"]
        if self.graph_parallel_size > 1:
            parts.append(f"partition {self.partition_index(global_rank)} of {self.graph_parallel_size}")
        if layers:
            parts.append(f"layers {layers[s]}")
        return f"rank {global_rank} ({', '.join(parts)})"

    def describe(self, virtual: List[List[int]], chunk_sizes: List[int], edge_cut: float) -> str:
        """One line for the log: the layers of every stage (and the stages of every rank when ``v > 1``) and the
        chunks: ``virtual`` the layers of every virtual stage, ``chunk_sizes`` nodes per chunk."""
        ranks = self.virtual_stage_ranks
        return (f"GNNPipeStrategy: stage -> layers {virtual}" + (
            f", rank -> stages {[[i for i, r in enumerate(ranks) if r == s] for s in range(self.num_stages)]}"
            if self.stages_per_rank > 1 else "") + f"; {len(chunk_sizes)} chunks of "
            f"{min(chunk_sizes)}-{max(chunk_sizes)} nodes, edge cut {edge_cut:.3f}")


def build_mesh(topology: PipelineTopology, device_type: str, timeout: timedelta,
               world_group: Optional[Any] = None) -> Tuple[DeviceMesh, Any, Any]:
    """Build the rank mesh and return ``(mesh, pipeline_group, partition_group)`` (a collective).

    Args:
        topology: The layout.
        device_type: ``"cpu"`` or ``"cuda"``.
        timeout: Timeout of the sub-groups' collectives.
        world_group: A group of every rank (the strategy's exchange group): the pipeline's when ``G = 1``.

    Returns:
        The mesh (1-D ``("stage",)`` without hybrid parallelism, else 2-D :data:`MESH_DIMS`), this rank's pipeline
        group (``world_group`` when ``G = 1``; ``None`` means the default group) and its partition group (``None``
        when ``G = 1``).
    """
    G, S = topology.graph_parallel_size, topology.num_stages
    if G == 1:
        group = world_group if world_group is not None else dist.group.WORLD
        return DeviceMesh.from_group(group, device_type, mesh_dim_names=MESH_DIMS[1:]), world_group, None
    layout = torch.arange(G * S).view(G, S)
    pp_group, _ = dist.new_subgroups_by_enumeration(layout.tolist(), timeout=timeout, group_desc="gnnpipe_pipeline")
    gp_group, _ = dist.new_subgroups_by_enumeration(layout.t().tolist(), timeout=timeout,
                                                    group_desc="gnnpipe_partition")
    mesh = DeviceMesh.from_group([gp_group, pp_group], device_type, mesh=layout, mesh_dim_names=MESH_DIMS)
    return mesh, pp_group, gp_group
