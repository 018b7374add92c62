"""This rank's part of the pipeline: its stages, their schedule, the loss, and the exact forward through them.

GNNPipe (arXiv 2308.10087, Sec. 4): the ``L`` layer blocks are cut into ``S * v`` consecutive (virtual) stages;
this rank builds the :class:`~lightning_gnnpipe.pipeline.stage.GNNStage` of each stage it runs, the
``torch.distributed.pipelining`` schedule over them (:mod:`~lightning_gnnpipe.pipeline.schedule`) and, on the last
stage, the loss (:mod:`~lightning_gnnpipe.pipeline.loss`). One training step is one schedule step over this
pipeline's ``K/G`` chunks; the full-graph output is then broadcast to every rank of the pipeline.

:meth:`PipelineRuntime.full_forward` is the exact full-graph forward of validation, test, predict and the history
refresh: the stages run in pipeline order, each on the whole graph layer by layer, and their outputs go from rank
to rank with ``send``/``recv`` (or stay in place when the next stage lives on the same rank).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lightning_gnnpipe.comm.accounting import CommStats
from lightning_gnnpipe.comm.partitions import PartitionExchange
from lightning_gnnpipe.data.chunk import ChunkPlan
from lightning_gnnpipe.data.chunk_graph import build_chunk_graph, storage_bytes
from lightning_gnnpipe.nn.chunk_call import chunk_graph_options
from lightning_gnnpipe.nn.gcn_norm import norm_keys
from lightning_gnnpipe.nn.stack import takes_x0
from lightning_gnnpipe.pipeline.boundary import BoundaryCast
from lightning_gnnpipe.pipeline.initial_embedding import InitialEmbeddingSync, recomputes_x0
from lightning_gnnpipe.pipeline.loss import PipelineLoss
from lightning_gnnpipe.pipeline.recorder import PipelineRecorder
from lightning_gnnpipe.pipeline.schedule import build_schedule
from lightning_gnnpipe.pipeline.stage import GNNStage


def _not_last_stage(*_: Any) -> Tensor:
    raise RuntimeError("GNNPipeStrategy: the loss ran on a stage that is not the last one.")


@dataclass
class RankLayout:
    """What this rank runs and where its neighbours are.

    Attributes:
        stage_ids: This rank's (virtual) stages, in pipeline order.
        stage_position: Pipeline position of every (virtual) stage, ``S * v`` ints.
        position: This rank's position ``s`` in its pipeline.
        global_ranks: Global rank of each pipeline position (this rank's pipeline), ``S`` ints.
        pipeline_group: The pipeline's process group (``None``: the world).
        partition_group: This stage's graph-parallel group (hybrid parallelism; ``None`` without).
        graph_parallel_size: ``G``.
        partition_index: ``g``.
    """

    stage_ids: List[int]
    stage_position: List[int]
    position: int
    global_ranks: List[int]
    pipeline_group: Any = None
    partition_group: Any = None
    graph_parallel_size: int = 1
    partition_index: int = 0

    @property
    def last_position(self) -> int:
        return self.stage_position[-1]

    @property
    def is_last(self) -> bool:
        return self.position == self.last_position


class PipelineRuntime:
    """Build and run this rank's stages.

    Args:
        blocks: The model's ``L`` layer blocks.
        stage_layers: Layers of every (virtual) stage, ``S * v`` lists of consecutive indices.
        dims: Width entering each layer and leaving the last, ``L + 1`` ints.
        plan: The chunk plan; ``edge_index`` ``(2, |E|)`` and ``x`` ``(|V|, F)`` the graph.
        layout: This rank's place (:class:`RankLayout`).
        device: Where the stages run.
        stats: Where traffic is counted.
        history_momentum, halo_gradients, history_dtype: As :class:`~lightning_gnnpipe.pipeline.stage.GNNStage`.
        boundary_dtype: Dtype between stages (the autocast dtype under ``bf16-mixed``, else ``x.dtype``).
        activation_checkpointing: Recompute each block in the backward pass (:class:`GNNStage`).
        eval_threads: Intra-op threads of a stage's compute in :meth:`full_forward` (``None``: the process's own). The
            stages of the exact forward run one after the other, so while one computes, the ranks of the others on
            the same machine wait for it: the strategy gives it their cores too.
    """

    def __init__(self, blocks: List[nn.Module], stage_layers: List[List[int]], dims: List[int], plan: ChunkPlan,
                 edge_index: Tensor, x: Tensor, layout: RankLayout, device: torch.device, stats: CommStats,
                 history_momentum: float = 0.0, halo_gradients: str = "detach",
                 boundary_dtype: Optional[torch.dtype] = None, activation_checkpointing: bool = False,
                 history_dtype: Optional[torch.dtype] = None, eval_threads: Optional[int] = None) -> None:
        self.layout, self.device, self.stats, self.dims = layout, device, stats, dims
        self.eval_threads = eval_threads
        self.num_nodes, self.num_virtual_stages = plan.num_nodes, len(stage_layers)
        self.data_dtype = x.dtype
        self.boundary_dtype = boundary_dtype or x.dtype
        # this rank's graph partition: a no-op with G = 1; with G > 1 (one stage per rank: multi-stage schedules are
        # refused) the exchange with the G ranks of its stage, the chunks it runs and the replicas' weights
        self.partitions = PartitionExchange(plan, layout.graph_parallel_size, layout.partition_index,
                                            layout.partition_group, stats, device)
        self.chunk_ids = self.partitions.chunks(plan.num_chunks)  # this pipeline's micro-batches, in order
        self.alternate = halo_gradients == "fresh"  # odd epochs run them in reverse (history/halo_grad.py)
        carry_x0 = any(takes_x0(b) for b in blocks)
        # GCNII's x0: computed on each stage from the features (block 0's weights and gradients cross), not sent
        local_x0 = recomputes_x0(blocks, x, len(stage_layers), layout.graph_parallel_size)
        self.x0_sync = InitialEmbeddingSync(blocks[0], layout.stage_position[0], layout.position,
                                            layout.pipeline_group, stats) if local_x0 else None
        self.stages: List[GNNStage] = []
        for i in layout.stage_ids:
            own = [blocks[layer] for layer in stage_layers[i]]
            graph = build_chunk_graph(plan, edge_index, norm_keys(own), device, dtype=x.dtype,
                                      chunks=self.partitions.graph_chunks(plan.num_chunks),
                                      **chunk_graph_options(own, autocast=self.boundary_dtype != x.dtype))
            self.partitions.broadcast(own)  # every pipeline takes partition 0's weights
            self.stages.append(GNNStage(own, stage_layers[i], dims, graph,
                                        x=x if 0 in stage_layers[i] or local_x0 else None,
                                        history_momentum=history_momentum, halo_gradients=halo_gradients,
                                        history_dtype=history_dtype, carry_x0=carry_x0, partitions=self.partitions,
                                        x0_block=blocks[0] if local_x0 else None,
                                        stage_index=i, activation_checkpointing=activation_checkpointing))
        # The first stage reads its chunks' rows from `x` itself (GNNStage): the schedule gets one placeholder row
        # per micro-batch, not a padded copy of the features.
        self.first_input: Optional[Tensor] = None
        if 0 in layout.stage_ids:
            self.first_input = x.new_zeros(len(self.chunk_ids), x.size(-1), device=device)
        self.step_size = len(self.chunk_ids)  # this pipeline's micro-batches a step (set by build_schedule)
        self.schedule: Any = None
        self.loss: Optional[PipelineLoss] = None
        self.recorder: Optional[PipelineRecorder] = None
        self._max_chunk_size = plan.max_chunk_size
        self.nodes = plan.nodes  # every chunk's inner nodes (the rows of a step's logits)

    def kept_bytes(self) -> Tuple[int, int]:
        """Bytes this rank keeps for the whole fit: ``(history tables, chunk graphs)``; each storage counted once."""
        tables = [t for st in self.stages for m in (*st.histories.values(), *st.halo_grads.values())
                  for t in m.buffers()]
        tables += [t for st in self.stages for m in st.histories.values() for t in (m.node_ids, m.row_of)]
        graph = sum(st.graph.nbytes() for st in self.stages)
        graph += storage_bytes(t for st in self.stages for t in st.runner.local_ids)
        return storage_bytes(tables), graph

    @property
    def widths(self) -> Dict[int, Tuple[List[int], List[int]]]:
        """Per local stage: (widths it receives, widths it sends)."""
        return {i: (st.input_widths, st.output_widths) for i, st in zip(self.layout.stage_ids, self.stages)}

    def build_schedule(self, schedule: str, loss_mode: str = "deferred", chunks_per_step: Optional[int] = None) -> None:
        """Build the loss (on the last stage) and the schedule; needed by :meth:`step` only (fit).

        Args:
            schedule: A key of :data:`~lightning_gnnpipe.pipeline.schedule.SCHEDULES`.
            loss_mode: How the last stage gets each chunk's output gradient (:class:`PipelineLoss`):
                ``"deferred"`` (GPipe only), ``"separable"`` or ``"chunk"``.
            chunks_per_step: Chunks of the whole graph a training step runs, ``c`` (default: all ``K``); this
                pipeline runs ``c / G`` of them, the schedule's micro-batches.
        """
        if chunks_per_step is not None:
            self.step_size = chunks_per_step // self.layout.graph_parallel_size
        if self.first_input is not None:
            self.first_input = self.first_input.new_zeros(self.step_size, self.first_input.size(-1))
        lay, last = self.layout, self.num_virtual_stages - 1
        gather = (lambda logits: self.partitions.sum(logits, "logits")) if self.partitions.size > 1 else None
        self.loss = PipelineLoss(self.stages[-1].graph, self.num_nodes, loss_mode, chunks=self.chunk_ids,
                                 gather=gather) if last in lay.stage_ids else None
        modules, in_dtypes, out_dtypes = [], [], []
        for i, stage in zip(lay.stage_ids, self.stages):
            in_dtypes.append(self.data_dtype if i == 0 else self.boundary_dtype)
            out_dtypes.append(self.data_dtype if i == last else self.boundary_dtype)
            modules.append(stage if self.boundary_dtype == self.data_dtype else
                           BoundaryCast(stage, self.data_dtype, out_dtypes[-1]))
        self.schedule = build_schedule(
            modules, lay.stage_ids, self.num_virtual_stages, self.device, self._max_chunk_size,
            [st.input_widths for st in self.stages], [st.output_widths for st in self.stages],
            schedule, self.step_size,
            # Every rank must pass a loss_fn: the schedules run backwards only when one is set.
            self.loss if self.loss is not None else _not_last_stage,
            group=lay.pipeline_group, in_dtypes=in_dtypes, out_dtypes=out_dtypes,
        )
        self.recorder = PipelineRecorder(self.schedule, self.stats, self.device)

    def stale_stats(self, datamodule: Any) -> Callable[[int], Tuple[float, float]]:
        """``stale_stats(epoch) -> (fraction of edges read historical, mean age in epochs)`` of this fit's chunk order:
        ``datamodule.stale_read_stats(reverse, alternating)`` by epoch parity (the order alternates with
        ``halo_gradients="fresh"``), or with several steps an epoch ``datamodule.step_read_stats(epoch)``."""
        if datamodule.chunks_per_step < datamodule.num_chunks:
            return datamodule.step_read_stats
        parity = [datamodule.stale_read_stats(bool(odd), self.alternate) for odd in range(1 + self.alternate)]
        return lambda epoch: parity[epoch % len(parity)]

    def step(self, full_loss: Callable, chunk_loss: Callable, chunks: Any = None) -> Tuple[Tensor, Any]:
        """Run one training step (every chunk of the step forward and backward); return the logits and the loss output.

        The chunks run in order; with ``halo_gradients="fresh"`` in reverse order in odd epochs.

        Args:
            full_loss: ``full_loss(logits (|V|, C)) -> (loss, output)``: the user's ``training_step`` (loss modes
                ``"deferred"`` and ``"separable"``; in the latter it is called once per chunk and must not log).
            chunk_loss: ``chunk_loss(out (n_c, C), c) -> loss``: the chunk loss (loss mode ``"chunk"``).
            chunks: The step's chunk group ``(c,)`` (ints or a tensor), in the order it runs (several steps an epoch,
                :mod:`~lightning_gnnpipe.data.steps`; with hybrid parallelism the chunks of every partition, of which
                this pipeline runs its own); ``None``: every chunk, one step an epoch.

        Returns:
            The full-graph logits ``(|V|, C)`` on every rank of the pipeline (zero on the rows of chunks outside the
            step), and the last stage's step output (``None`` elsewhere or when the schedule computed no full loss).

        Raises:
            RuntimeError: ``chunks`` gives this pipeline another number of chunks than the schedule was built for.
        """
        assert self.schedule is not None and self.recorder is not None
        lay = self.layout
        chunks = None if chunks is None else [int(c) for c in chunks]
        if chunks is None:
            odd = self.alternate and self.stages[0].epoch % 2 == 1
            order = self.chunk_ids[::-1] if odd else self.chunk_ids
        else:
            mine = set(self.chunk_ids)
            order = [c for c in chunks if c in mine]
        if len(order) != self.step_size:
            raise RuntimeError(f"GNNPipeStrategy: a training step gave this pipeline {len(order)} chunks but its "
                               f"schedule runs {self.step_size} a step (got chunks {list(chunks or [])}). Serve the "
                               "batches of the GraphChunkDataModule the strategy was set up with.")
        ids = torch.tensor(order)  # on the CPU: read without a device sync
        args = (self.first_input,) if self.first_input is not None else ()
        kwargs: Dict[str, Any] = {"chunk_id": ids}
        if self.loss is not None:
            self.loss.reset(full_loss=full_loss, chunk_loss=chunk_loss, chunks=order)
            kwargs.update(target=ids, return_outputs=False)
        self.recorder.begin()
        if self.x0_sync is not None:
            self.x0_sync.weights()
        self.schedule.step(*args, **kwargs)
        if self.x0_sync is not None:
            self.x0_sync.gradients()
        if self.loss is not None:
            logits = self.loss.logits()
        else:
            logits = torch.empty(self.num_nodes, self.dims[-1], device=self.device, dtype=self.data_dtype)
        src = lay.global_ranks[lay.last_position]
        if chunks is None or len(chunks) == len(self.nodes):  # the whole graph's rows
            dist.broadcast(logits, src=src, group=lay.pipeline_group)
            sent = logits
        else:  # only the step's rows are not zero: send those alone
            rows = torch.cat([self.nodes[c] for c in chunks]).to(self.device)
            sent = logits.index_select(0, rows) if self.loss is not None else \
                torch.empty(rows.numel(), self.dims[-1], device=self.device, dtype=self.data_dtype)
            dist.broadcast(sent, src=src, group=lay.pipeline_group)
            if self.loss is None:
                logits = logits.zero_().index_copy_(0, rows, sent)
        self.partitions.sum_grads(p for st in self.stages for p in st.parameters())
        self.recorder.end()
        self.stats.record_broadcast("logits", sent, lay.last_position, lay.position, len(lay.global_ranks))
        return logits, (self.loss.step_output if self.loss is not None else None)

    def full_forward(self, write_history: bool = False,
                     drift: Optional[Dict[int, Tuple[float, float]]] = None) -> Tensor:
        """Exact layer-by-layer forward through all stages; return the logits ``(|V|, C)`` on every rank.

        With one partition the rows pass from stage to stage in the chunk order of the plan the stages share (each
        stage keeps them so while it runs), not put back in node order and out of it again at every boundary.

        Args:
            write_history: Refill the history tables with the exact inputs of every layer (a refresh).
            drift: Receives each refreshed layer's ``||h_hist - h_exact||^2`` and ``||h_exact||^2`` (this rank's tables).
        """
        lay, n, h = self.layout, self.num_nodes, None
        rank_of = lay.global_ranks
        # With one partition every stage runs every chunk of one plan: the rows between stages stay in its chunk order
        ordered = lay.graph_parallel_size == 1
        last = len(lay.stage_position) - 1
        if self.x0_sync is not None:
            self.x0_sync.weights()
        outputs: tuple = ()
        for i, stage in zip(lay.stage_ids, self.stages):
            if i == 0:
                inputs = [stage.x]
            elif lay.stage_position[i - 1] == lay.position:  # the previous stage ran here: its outputs are the inputs
                inputs = [t.to(self.boundary_dtype).to(self.data_dtype) for t in outputs]
            else:
                inputs = [torch.empty(n, d, device=self.device, dtype=self.boundary_dtype) for d in stage.input_widths]
                for t in inputs:
                    dist.recv(t, src=rank_of[lay.stage_position[i - 1]], group=lay.pipeline_group)
                inputs = [t.to(self.data_dtype) for t in inputs]
            with intra_op_threads(self.eval_threads):  # the other stages wait meanwhile: their cores are free
                out = stage.forward_full(*inputs, write_history=write_history, drift=drift,
                                         chunk_order=(ordered and i > 0, ordered and i < last))
            outputs = out if isinstance(out, tuple) else (out,)
            if i == last:
                h = outputs[0].to(self.data_dtype)
            elif lay.stage_position[i + 1] != lay.position:
                for t in outputs:
                    dist.send(t.to(self.boundary_dtype).contiguous(), dst=rank_of[lay.stage_position[i + 1]],
                              group=lay.pipeline_group)
        if not lay.is_last:
            h = torch.empty(n, self.dims[-1], device=self.device, dtype=self.data_dtype)
        assert h is not None
        dist.broadcast(h, src=rank_of[lay.last_position], group=lay.pipeline_group)
        return h


_forked = False


def _note_fork() -> None:
    global _forked
    _forked = True


# GNU OpenMP cannot start a larger thread team in a process forked after its parent used one: the first parallel
# region hangs (a fork-started rank, ``strategy="ddp_fork"``-style launchers and tests). Such a rank keeps its count.
os.register_at_fork(after_in_child=_note_fork)


@contextmanager
def intra_op_threads(threads: Optional[int]) -> Iterator[None]:
    """Run the block with ``threads`` intra-op threads (``None``: as they are), then restore the number.

    In a process started by ``fork`` the number is only ever lowered, never raised: OpenMP's thread team cannot grow
    after a fork (its first parallel region would hang).
    """
    before = torch.get_num_threads()
    if threads is not None and _forked:
        threads = min(threads, before)
    if threads is not None and threads != before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def check_stage_widths(widths: Dict[int, Tuple[List[int], List[int]]], group: Any = None) -> None:
    """Check that every stage sends what the next stage expects (a collective: call on every rank).

    Stages exchange fixed-shape buffers, so a width mismatch (a model built differently on some
    rank) would otherwise surface as a failed or hanging transfer.

    Args:
        widths: For each (virtual) stage on this rank, its index -> (widths of the tensors it receives,
            widths of the tensors it sends).
        group: The pipeline's process group (default: world).

    Raises:
        RuntimeError: On every rank, if stage ``s`` sends other widths than stage ``s + 1`` expects.
    """
    gathered: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, {k: (list(i), list(o)) for k, (i, o) in widths.items()}, group=group)
    merged: Dict[int, Any] = {}
    for part in gathered:
        merged.update(part)
    infos = [merged[s] for s in sorted(merged)]
    for s in range(len(infos) - 1):
        sent, expected = infos[s][1], infos[s + 1][0]
        if sent != expected:
            raise RuntimeError(
                f"GNNPipeStrategy: stage {s} sends embeddings of widths {sent} but stage {s + 1} expects widths "
                f"{expected} (got (in, out) widths per stage {infos}). Build the model identically on every "
                "rank: same hyperparameters, no layers that depend on the rank."
            )
