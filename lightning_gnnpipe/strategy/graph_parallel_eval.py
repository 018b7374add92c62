"""GNNPipe's exact evaluation forward run the graph-parallel way: all ranks compute at once.

The pipelined exact forward (:meth:`~lightning_gnnpipe.pipeline.runtime.PipelineRuntime.full_forward`) runs the
stages one after the other: while one stage computes every node's rows of its layers, the other ranks wait. For
evaluation the weights are fixed, so the ``S`` ranks of a pipeline can share the nodes instead: each takes a group of
about ``K / S`` chunks that read each other's rows (:func:`~lightning_gnnpipe.comm.halo_rows.chunk_groups`), merged
into one part (:func:`~lightning_gnnpipe.comm.halo_rows.group_plan`), through all ``L`` layers with every stage's
current weights (the strategy copies them from their owners first), and receives its halo rows from the other parts
before each message-passing layer: graph parallelism's forward
(:class:`~lightning_gnnpipe.strategy.partition_forward.PartitionForward`), without gradients. The logits are the
pipelined forward's (the same blocks on the same exact rows; ``tests/test_eval_modes.py``; under ``bf16-mixed``
they differ by the pipeline's rounding at stage boundaries). Bytes per evaluation: every stage's weights once (one
broadcast per owner and dtype) and every message-passing layer's halo rows of the parts, against ``|V| x d`` per stage
boundary for the pipelined forward.

A history refresh runs in the same forward where the evaluation runs graph-parallel (:meth:`GraphParallelEvaluation.refresh`:
each rank sends its part's rows of every table to the table's stage, :mod:`~lightning_gnnpipe.strategy.graph_parallel_refresh`).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lightning_gnnpipe.comm.halo_rows import chunk_groups, group_halos, group_plan
from lightning_gnnpipe.comm.partitions import PartitionExchange
from lightning_gnnpipe.data.chunk import ChunkPlan
from lightning_gnnpipe.data.chunk_graph import build_chunk_graph
from lightning_gnnpipe.nn.chunk_call import chunk_graph_options
from lightning_gnnpipe.nn.gcn_norm import norm_keys
from lightning_gnnpipe.nn.stack import eval_mode, takes_x0, uses_graph
from lightning_gnnpipe.pipeline.initial_embedding import recomputes_x0
from lightning_gnnpipe.strategy.allocator import evaluation_heap, release_shared_pages
from lightning_gnnpipe.strategy.checks import AUTO_MAX_BYTES_RATIO, resolve_evaluation  # noqa: F401  (its rule)
from lightning_gnnpipe.strategy.graph_parallel_refresh import TableRefresh
from lightning_gnnpipe.strategy.partition_forward import PartitionForward
from lightning_gnnpipe.strategy.state import sync_stage_tensors


def exchange_bytes_ratio(blocks: List[nn.Module], plan: ChunkPlan, num_ranks: int, dims: List[int],
                         stage_layers: List[List[int]], x0_sent: bool = True) -> float:
    """Rows x widths the graph-parallel evaluation exchanges, over those the pipelined forward sends (unitless).

    Graph-parallel: every group's halo rows (:func:`~lightning_gnnpipe.comm.halo_rows.group_halos` of
    :func:`~lightning_gnnpipe.comm.halo_rows.chunk_groups`) before each message-passing layer ``l >= 1`` (layer 0
    reads the features locally), ``H x sum(d_l)``. Pipelined: ``|V|`` rows of the input width of every virtual stage
    but the first, plus ``x0``'s width where a later block takes it (GCNII) and ``x0_sent`` (not where the later
    stages compute ``x0``, :mod:`~lightning_gnnpipe.pipeline.initial_embedding`). Weights and logits are left out.
    """
    halo = sum(int(h.numel()) for h in group_halos(plan, chunk_groups(plan, num_ranks)))
    split = halo * sum(dims[j] for j, b in enumerate(blocks) if j >= 1 and uses_graph(b))
    x0 = dims[1] if x0_sent and any(takes_x0(b) for b in blocks) else 0
    piped = plan.num_nodes * sum(dims[layers[0]] + (x0 if layers[0] > 1 else 0) for layers in stage_layers[1:])
    return split / max(piped, 1)


class GraphParallelEvaluation:
    """The exact whole-graph forward of all ``L`` blocks, this rank computing one part of ``S``.

    Args:
        blocks: The model's ``L`` layer blocks (the user's modules, shared).
        plan: The chunk plan (``K >= S`` chunks); ``edge_index`` ``(2, |E|)`` and ``x`` ``(|V|, F)`` the graph.
        num_ranks: ``S``, the ranks that share the forward (a pipeline's); ``position``: this rank's, in ``[0, S)``.
        group: Their process group (``None``: the world).
        device: Where the forward runs.
        autocast: Whether evaluation runs under autocast (``bf16-mixed``): the part's graph then holds edge lists, and
            the logits (cast to ``x``'s dtype) are rounded as on one device, not at the pipeline's stage boundaries
            (so ``"auto"`` keeps the pipelined forward there).
        release_features: Let go of the pages of ``x`` after each run when it is in shared memory
            (:func:`~lightning_gnnpipe.strategy.allocator.release_shared_pages`): on a rank whose training never
            reads the features (no first stage), which released them after setup too.

    Memory: the part's chunk graph, kept for the fit (about ``1 / S`` of a stage's, which holds all ``K`` chunks),
    and while it runs one part's rows (``|V| / S`` plus its halo) per layer.

    Raises:
        ValueError: ``S`` exceeds ``K`` (:func:`~lightning_gnnpipe.comm.halo_rows.chunk_groups`).

    Shapes:
        ``__call__()`` -> ``(|V|, C)`` on every rank.
    """

    def __init__(self, blocks: List[nn.Module], plan: ChunkPlan, edge_index: Tensor, x: Tensor, num_ranks: int,
                 position: int, group, device: torch.device, autocast: bool = False,
                 release_features: bool = False) -> None:
        self.groups = chunk_groups(plan, num_ranks)
        parts = group_plan(plan, self.groups)  # one chunk per rank: its group, with the group's halo
        graph = build_chunk_graph(parts, edge_index, norm_keys(blocks), device, dtype=x.dtype, chunks=[position],
                                  **chunk_graph_options(blocks, autocast=autocast))
        self.forward = PartitionForward(blocks, graph, PartitionExchange(parts, num_ranks, position, group, None,
                                                                         device), x)
        self.group, self.num_nodes, self.dtype = group, plan.num_nodes, x.dtype
        self.release_features = release_features
        self.plan, self.parts, self.position = plan, parts, position

    @staticmethod
    def build(evaluation: str, graph_parallel_size: int, blocks: List[nn.Module], plan: ChunkPlan, edge_index: Tensor,
              x: Tensor, num_ranks: int, position: int, group, device: torch.device, autocast: bool = False,
              dims: Optional[List[int]] = None,
              stage_layers: Optional[List[List[int]]] = None) -> Optional["GraphParallelEvaluation"]:
        """One if the strategy's ``evaluation`` resolves to ``"graph_parallel"`` with ``G = graph_parallel_size``
        (:func:`~lightning_gnnpipe.strategy.checks.resolve_evaluation`), else ``None``; the rest as the class's.

        ``"auto"`` also weighs :func:`exchange_bytes_ratio` there (``dims``: the width entering each layer;
        ``stage_layers``: the layers of every virtual stage). Every position but 0, which
        runs the first stage, lets go of the features' pages after each run (``release_features``)."""
        ratio = None if dims is None or stage_layers is None else \
            (lambda: exchange_bytes_ratio(blocks, plan, num_ranks, dims, stage_layers, not recomputes_x0(
                blocks, x, len(stage_layers), graph_parallel_size)))
        if resolve_evaluation(evaluation, graph_parallel_size, plan.num_chunks, num_ranks, autocast, ratio) \
                != "graph_parallel":
            return None
        return GraphParallelEvaluation(blocks, plan, edge_index, x, num_ranks, position, group, device, autocast,
                                       release_features=position != 0)

    @torch.no_grad()
    def __call__(self, module: nn.Module, owners: Dict[int, int], epoch: int = 0) -> Tensor:
        """The logits ``(|V|, C)`` of the exact forward on every rank (a collective over the group).

        Args:
            module: The user's module, whose every stage's parameters and buffers are first copied from the rank
                that trains them (:func:`~lightning_gnnpipe.strategy.state.sync_stage_tensors` with ``owners``).
            epoch: Keys :class:`~lightning_gnnpipe.nn.NodeDropout`'s masks.
        """
        sync_stage_tensors(module, owners, group=self.group)
        out = self.forward(epoch).to(self.dtype)
        full = out.new_zeros(self.num_nodes, out.size(1))
        full[self.forward.graph.nodes[self.forward.part]] = out
        dist.all_reduce(full, group=self.group)
        if self.release_features:
            release_shared_pages([self.forward.runner.x])
        return full

    def refresh(self, module: nn.Module, owners: Dict[int, int], epoch: int, stages: List[nn.Module],
                layer_owner: Dict[int, int], drift: Dict[int, Tuple[float, float]]) -> Tensor:
        """:meth:`__call__` that also refills every stage's history tables (a history refresh, in eval mode:
        :class:`~lightning_gnnpipe.strategy.graph_parallel_refresh.TableRefresh`; a collective over the group).

        Args:
            stages: This rank's stages; ``layer_owner``: the position of the rank that keeps each layer's table.
            drift: Receives each of this rank's tables' ``(||old - exact||^2, ||exact||^2)``.
        """
        self.forward.on_layer_input = TableRefresh(stages, layer_owner, self.parts, self.plan, self.position,
                                                   self.group, drift)
        try:
            with eval_mode(self.forward.blocks):
                return self(module, owners, epoch)
        finally:
            self.forward.on_layer_input = None

    def nbytes(self) -> int:
        """Bytes of the part's chunk graph."""
        return self.forward.graph.nbytes()


def exact_forward(split: Optional[GraphParallelEvaluation], runtime: Any, module: nn.Module, owners: Dict[int, int],
                  layers: List[List[int]], write_history: bool = False,
                  drift: Optional[Dict[int, Tuple[float, float]]] = None) -> Tensor:
    """GNNPipe's exact forward, the logits ``(|V|, C)`` on every rank: graph-parallel where the evaluation is (``split``;
    a refresh, ``write_history``, fills the tables there too), else pipelined
    (:meth:`~lightning_gnnpipe.pipeline.runtime.PipelineRuntime.full_forward`, also under hybrid parallelism).

    Args:
        split: The graph-parallel evaluation, or ``None`` (``evaluation`` resolved to ``"pipeline"``).
        runtime: The rank's :class:`~lightning_gnnpipe.pipeline.runtime.PipelineRuntime`.
        module: The user's LightningModule; ``owners``: the rank that trains each block's tensors; ``layers``: the
            layers of each pipeline position.
        write_history: Refill the history tables (a refresh).
        drift: Receives each refreshed table's squared norms (:meth:`~lightning_gnnpipe.history.history.History.refresh`).

    Raises:
        RuntimeError: As :class:`~lightning_gnnpipe.strategy.graph_parallel_refresh.TableRefresh` (a table that keeps
            other rows than a stage holding every chunk would), and a collective's timeout.
    """
    with evaluation_heap():
        if split is None or runtime.layout.graph_parallel_size > 1:
            return runtime.full_forward(write_history=write_history, drift=drift)
        args = (module, owners, runtime.stages[0].epoch)
        if not write_history:
            return split(*args)
        owner = {layer: s for s, own in enumerate(layers) for layer in own}
        return split.refresh(*args, runtime.stages, owner, drift if drift is not None else {})
