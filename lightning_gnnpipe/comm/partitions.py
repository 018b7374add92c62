"""The graph partitions of one stage: everything hybrid and graph parallelism change, in one object.

Hybrid parallelism (``GNNPipeStrategy(graph_parallel_size=G)``: ``S`` stages x ``G`` partitions) runs ``G`` pipelines,
one per graph partition; graph parallelism (``GraphParallelStrategy``, e.g. DistGNN, arXiv 2104.06700) is the case of
one stage and one chunk per partition (``K = G``). The ``G`` ranks that hold one stage run it in lockstep, each on its
own partition. :class:`PartitionExchange` is what that changes, for one rank:

* the chunks it runs: partition ``g``'s, ``c = j * G + g`` (:func:`~lightning_gnnpipe.data.partition.nested_partition`);
* the rows its history tables keep: its chunks and their halos, not ``|V|``;
* the halo rows of every message-passing layer ``l >= 1``: the rows the other partitions send in the same slot, used
  live with autograd (:class:`~lightning_gnnpipe.comm.exchange.RowExchange`), the rest read from the tables;
* the exact whole-graph forward (evaluation, history refresh): after every message-passing layer a partition
  receives its halo's rows from their owners, each row once (:meth:`PartitionExchange.share_halo_rows`), and the
  last stage's output is gathered whole once (:meth:`PartitionExchange.gather_rows`);
* the training step's logits, each partition's rows nonzero on its own chunks only, summed over the ``G`` ranks;
* the weights: every replica starts from partition 0's, and their gradients are summed after every step
  (:mod:`~lightning_gnnpipe.comm.replicas`).

With ``G = 1`` (pure pipeline parallelism: ``PartitionExchange()``) every method is the pipeline's own behaviour or a
no-op, so stages and runtime take such an object and never ask whether the run is hybrid: a change to the hybrid's
exchanges is a change to this file.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lightning_gnnpipe.comm.accounting import CommStats
from lightning_gnnpipe.comm.exchange import RowExchange, SlotPlan, build_slot_plans, partition_halos
from lightning_gnnpipe.comm.halo_rows import HaloRows
from lightning_gnnpipe.comm.replicas import all_reduce_grads, broadcast_blocks
from lightning_gnnpipe.data.chunk import ChunkPlan
from lightning_gnnpipe.data.chunk_graph import ChunkGraph


class PartitionExchange:
    """This rank's partition ``g`` of ``G`` and every exchange with the other ``G - 1`` ranks of its stage.

    Args:
        plan: The slot-major chunk plan (needed when ``num_parts > 1``).
        num_parts: ``G`` (default 1: no partitions, every method a no-op).
        part: This rank's partition ``g``.
        group: The process group of the ``G`` ranks of this stage (``None``: the world).
        stats: Where the exchanged bytes and waits are counted (``None``: not counted).
        device: Where the exchange plans live (the stage's device).

    Raises:
        ValueError: ``num_parts > 1`` without a ``plan``, or ``part`` outside ``[0, G)``.
    """

    def __init__(self, plan: Optional[ChunkPlan] = None, num_parts: int = 1, part: int = 0, group=None,
                 stats: Optional[CommStats] = None, device: Optional[torch.device] = None) -> None:
        if not 0 <= part < num_parts:
            raise ValueError(f"PartitionExchange: `part` must be in [0, {num_parts}) (got {part}).")
        if num_parts > 1 and plan is None:
            raise ValueError(f"PartitionExchange: {num_parts} partitions need the chunk plan (got plan=None).")
        self.size, self.index, self.group, self.stats = num_parts, part, group, stats
        self.plans: List[Optional[SlotPlan]] = []
        self._halo_plan: Optional[HaloRows] = None  # the exact forward's exchange (whole partitions), built at first use
        self._halo_inputs: Optional[tuple] = None
        if plan is not None and num_parts > 1:
            halos = partition_halos(plan, num_parts)
            self.plans = [p.to(device) if p is not None and device is not None else p
                          for p in build_slot_plans(plan, num_parts, part, halos)]
            self._halo_inputs = (plan, halos, device)

    def _halo_rows(self) -> Optional[HaloRows]:
        """The exact forward's exchange plan, built at its first use (graph parallelism's training never needs it)."""
        if self._halo_plan is None and self._halo_inputs is not None:
            plan, halos, device = self._halo_inputs
            self._halo_plan = HaloRows.build(plan, [self.chunks_of(q, plan.num_chunks) for q in range(self.size)],
                                             self.index, device, halos)
            self._halo_inputs = None
        return self._halo_plan

    def chunks(self, num_chunks: int) -> List[int]:
        """The chunks this partition runs, in slot order: ``g, g + G, ...`` of ``K``."""
        return self.chunks_of(self.index, num_chunks)

    def chunks_of(self, part: int, num_chunks: int) -> List[int]:
        """The chunks partition ``part`` runs, in slot order."""
        return list(range(part, num_chunks, self.size))

    def graph_chunks(self, num_chunks: int) -> Optional[List[int]]:
        """The chunks whose halos and edges this rank's chunk graphs need (``None``: all, when ``G = 1``)."""
        return None if self.size == 1 else self.chunks(num_chunks)

    def table_rows(self, graph: ChunkGraph, chunks: Sequence[int]) -> Optional[Tensor]:
        """The sorted global ids whose rows a stage's history tables keep: its chunks' and their halos' (every row
        pushed, received or read); ``None`` when ``G = 1`` (the stage decides alone).

        Raises:
            RuntimeError: A row the exchange delivers has no table row (the chunk plan and the slot plans differ).
        """
        if self.size == 1:
            return None
        ids = torch.cat([t for c in chunks for t in (graph.nodes[c], graph.halo[c])]).unique()
        received = [self.plans[c].recv_ids for c in chunks if self.plans[c] is not None]
        if received and not bool(torch.isin(torch.cat(received), ids).all()):
            raise RuntimeError("PartitionExchange: the exchange delivers rows of nodes outside this partition's "
                               "chunks and halos (got a slot plan that does not match the chunk plan). Build both "
                               "from the same plan.")
        return ids

    def halo_into(self, h: Tensor, c: int, halo: Tensor, out: Tensor, table: Optional[nn.Module] = None) -> None:
        """Write chunk ``c``'s halo rows ``halo`` ``(h_c,)`` of one layer into ``out`` ``(h_c, d)``.

        With ``G = 1`` they come from ``table`` (a :class:`~lightning_gnnpipe.history.history.History`). With
        ``G > 1`` the chunk's rows ``h`` ``(n_c, d)`` go to the other partitions first (a collective over the
        stage's ranks); the rows received are written into ``table`` and the ones of the same slot are used live,
        their gradients sent back in the backward pass; without ``table`` (graph parallelism) every halo row must be
        live.

        Raises:
            RuntimeError: ``G > 1`` and chunk ``c`` is not one of this partition's.
        """
        if self.size == 1:
            if table is not None:
                table.pull_into(halo, out)
            return
        plan = self.plans[c]
        if plan is None:
            raise RuntimeError(f"PartitionExchange: chunk {c} is not one of partition {self.index}'s (got chunk "
                               f"{c}, partition of {c % self.size}). Run the chunks of `chunks()` only.")
        received = RowExchange.apply(h, plan, self.stats, self.group)
        if table is not None:
            table.push(plan.recv_ids, received)
            table.pull_into(halo, out)
        out.index_put_((plan.live_pos,), received.index_select(0, plan.back_sel))

    @contextmanager
    def uncounted(self) -> Iterator[None]:
        """Exchange without counting bytes or waits while the context is open (the exact forward of evaluation:
        :class:`~lightning_gnnpipe.comm.accounting.CommStats` holds a training step's traffic)."""
        stats, self.stats = self.stats, None
        try:
            yield
        finally:
            self.stats = stats

    def sum(self, t: Tensor, kind: Optional[str] = None) -> Tensor:
        """Sum ``t`` over the ``G`` ranks in place and return it (``G = 1``: ``t`` as it is).

        ``kind``: count the all-reduce as this kind of traffic (:data:`~lightning_gnnpipe.comm.accounting.KINDS`).
        """
        if self.size == 1:
            return t
        if kind is None or self.stats is None:
            dist.all_reduce(t, group=self.group)
            return t
        with self.stats.waiting():
            dist.all_reduce(t, group=self.group)
        self.stats.record_all_reduce(kind, t, self.size)
        return t

    def share_halo_rows(self, out: Tensor) -> Tensor:
        """Exact whole-graph forward: complete a layer's output ``out`` ``(|V|, d)``, which holds this partition's
        rows (other rows zero or stale), with the rows of this partition's halo, received from their owners (one
        ``all_to_all_single`` over the stage's ``G`` ranks, each halo row once); return ``out`` (``G = 1``: as it is).

        The next layer of this partition's chunks then reads exact rows only; rows outside the partition and its halo
        are never read. Bytes: ``H_g x d`` received per layer, against the ``2 (G-1)/G |V| x d`` of summing ``out``.
        """
        plan = self._halo_rows()
        return out if plan is None else plan.share(out, self.group)

    def gather_rows(self, out: Tensor) -> Tensor:
        """The whole graph's result ``(|V|, d)`` on every rank of the stage from each partition's own rows of ``out``
        (other rows ignored): one all-reduce of ``|V| x d`` (``G = 1``: ``out`` as it is)."""
        plan = self._halo_rows()
        return out if plan is None else plan.gather(out, self.group)

    def sum_grads(self, params: Iterable[nn.Parameter]) -> None:
        """Sum the gradients of the replicas' parameters over the ``G`` ranks (one flat all-reduce; ``G = 1``: no-op)."""
        if self.size > 1:
            all_reduce_grads(list(params), self.stats if self.stats is not None else CommStats(), self.size,
                             self.group)

    def broadcast(self, blocks: List[nn.Module]) -> None:
        """Give every partition's replica of ``blocks`` partition 0's weights and buffers (``G = 1``: no-op)."""
        if self.size > 1:
            src = dist.get_global_rank(self.group, 0) if self.group is not None else 0
            broadcast_blocks(blocks, src=src, group=self.group)
