"""The one row exchange of graph parallelism and hybrid parallelism: halo rows forward, their gradients back.

Graph parallelism (e.g. DistGNN, arXiv 2104.06700; the baseline of GNNPipe, arXiv 2308.10087, Sec. 2) and
hybrid parallelism (``GNNPipeStrategy(graph_parallel_size=G)``: ``S`` stages x ``G`` graph partitions) both cut
the graph into ``G`` partitions and each partition into ``K/G`` chunks; chunk ``c = j * G + g`` is the ``j``-th
micro-batch of partition ``g`` (:func:`~lightning_gnnpipe.data.partition.nested_partition`). The ``G`` ranks that
hold one stage (all layers, under graph parallelism) form a graph-parallel group and run in lockstep: in slot
``j`` they all process their partition's ``j``-th chunk. At every message-passing layer ``l >= 1`` each of them
sends the rows of its current chunk that any chunk of another partition reads (one ``all_to_all_single``), so
the receivers hold them from now on:

* rows of a chunk in the *same slot* are used as they arrive, with autograd: their gradients travel back in
  the backward pass (:class:`RowExchange`; exact, as in graph parallelism);
* rows of earlier slots are read fresh from the history table, rows of later slots historical (as in GNNPipe).

Graph parallelism is the case ``K = G``, ``S = 1``: one slot, every halo row live. Bytes per epoch and layer:
every cross-partition halo row once forward, and the same-slot ones once backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from lightning_gnnpipe.comm.accounting import CommStats, nbytes
from lightning_gnnpipe.data.chunk import ChunkPlan


@dataclass
class SlotPlan:
    """What chunk ``c``'s rank sends and receives in one layer's exchange.

    Attributes:
        send_index: Local rows of chunk ``c`` to send, grouped by destination partition, ``(sum(send_counts),)``.
        send_counts: Rows sent to each partition, ``G`` ints (0 to itself).
        recv_counts: Rows received from each partition, ``G`` ints.
        recv_ids: Global node id of every received row, in arrival order, ``(sum(recv_counts),)``.
        back_sel: Received rows that chunk ``c`` itself reads (same slot: used with autograd),
            indices into the received rows, grouped by source partition.
        live_pos: Position in ``halo[c]`` of each of those rows.
        back_counts: Live rows received from each partition (their gradients go back), ``G`` ints.
        back_index: Local rows of chunk ``c`` read live by the other partitions' chunks of the slot
            (they get gradients back), grouped by partition.
        back_recv_counts: Those rows per partition, ``G`` ints.
    """

    send_index: Tensor
    send_counts: List[int]
    recv_counts: List[int]
    recv_ids: Tensor
    back_sel: Tensor
    live_pos: Tensor
    back_counts: List[int]
    back_index: Tensor
    back_recv_counts: List[int]

    def to(self, device: torch.device) -> "SlotPlan":
        """Return a copy with every index tensor on ``device`` (counts stay Python ints)."""
        t = lambda x: x.to(device)  # noqa: E731
        return SlotPlan(t(self.send_index), self.send_counts, self.recv_counts, t(self.recv_ids), t(self.back_sel),
                        t(self.live_pos), self.back_counts, t(self.back_index), self.back_recv_counts)


def partition_halos(plan: ChunkPlan, num_parts: int) -> List[Tensor]:
    """Halo of every partition: the out-of-partition sources of edges into it.

    Args:
        plan: Slot-major chunk plan (chunk ``c`` belongs to partition ``c % G``).
        num_parts: ``G``.

    Returns:
        ``G`` sorted node-id tensors ``(H_g,)``, ``torch.long``; ``sum(H_g)`` is ``H_G`` of
        :func:`~lightning_gnnpipe.planner.volume.hybrid_volume`.
    """
    halos = []
    partition = plan.part % num_parts
    for g in range(num_parts):
        rows = torch.cat([plan.halo[c] for c in range(g, plan.num_chunks, num_parts)])
        rows = torch.unique(rows)
        halos.append(rows[partition[rows] != g])
    return halos


def build_slot_plans(plan: ChunkPlan, num_parts: int, part: int,
                     halos: Optional[List[Tensor]] = None) -> List[Optional[SlotPlan]]:
    """Build the :class:`SlotPlan` of every chunk of partition ``part`` (``None`` for other chunks).

    Args:
        plan: The chunk plan, slot-major (chunk ``j * G + g`` is partition ``g``'s ``j``-th chunk).
        num_parts: ``G``.
        part: This rank's partition ``g``.
        halos: :func:`partition_halos` of ``plan`` when the caller has them (computed here otherwise).
    """
    halos = partition_halos(plan, num_parts) if halos is None else halos
    plans: List[Optional[SlotPlan]] = [None] * plan.num_chunks
    for c in range(part, plan.num_chunks, num_parts):
        j = c // num_parts
        nodes, halo = plan.nodes[c], plan.halo[c]
        send, send_counts, recv_ids, recv_counts = [], [], [], []
        back_sel, live_pos, back_counts, grad, back_recv_counts = [], [], [], [], []
        offset = 0
        for q in range(num_parts):
            peer = j * num_parts + q
            if q == part:
                empty = nodes.new_zeros(0)
                send.append(empty)
                recv_ids.append(empty)
                grad.append(empty)
                send_counts.append(0)
                recv_counts.append(0)
                back_counts.append(0)
                back_recv_counts.append(0)
                continue
            rows = torch.isin(nodes, halos[q]).nonzero().view(-1)
            send.append(rows)
            send_counts.append(int(rows.numel()))
            incoming = plan.nodes[peer][torch.isin(plan.nodes[peer], halos[part])]
            recv_ids.append(incoming)
            recv_counts.append(int(incoming.numel()))
            live = torch.isin(incoming, halo).nonzero().view(-1)
            back_sel.append(live + offset)
            live_pos.append(torch.searchsorted(halo, incoming[live]))
            back_counts.append(int(live.numel()))
            offset += int(incoming.numel())
            rows_read = torch.isin(nodes, plan.halo[peer]).nonzero().view(-1)
            grad.append(rows_read)
            back_recv_counts.append(int(rows_read.numel()))
        cat = lambda xs: torch.cat(xs) if xs else nodes.new_zeros(0)  # noqa: E731
        plans[c] = SlotPlan(cat(send), send_counts, recv_counts, cat(recv_ids), cat(back_sel), cat(live_pos),
                            back_counts, cat(grad), back_recv_counts)
    return plans


class RowExchange(torch.autograd.Function):
    """``received = exchange(h)`` over ``all_to_all_single``; backward sends received rows' gradients back.

    ``plan`` provides ``send_index``/``send_counts`` (rows of ``h`` to send, grouped by destination),
    ``recv_counts``, and for the backward ``back_sel`` (received rows whose gradient goes back, ``None`` for
    all), ``back_counts`` (per source rank), ``back_index`` and ``back_recv_counts`` (rows of ``h`` that get
    gradients back, grouped by rank). Driven by a :class:`SlotPlan`.

    Shapes:
        forward: ``h`` ``(n, d)`` -> ``(sum(recv_counts), d)``.
    """

    @staticmethod
    def forward(ctx, h: Tensor, plan, stats: Optional[CommStats], group=None) -> Tensor:  # type: ignore[override]
        ctx.plan, ctx.stats, ctx.group, ctx.rows = plan, stats, group, h.size(0)
        send = h.index_select(0, plan.send_index).contiguous()
        return _exchange(send, plan.recv_counts, plan.send_counts, stats, "halo_embeddings", group)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        plan = ctx.plan
        back = grad if plan.back_sel is None else grad.index_select(0, plan.back_sel)
        got = _exchange(back.contiguous(), plan.back_recv_counts, plan.back_counts, ctx.stats, "halo_gradients",
                        ctx.group)
        out = grad.new_zeros(ctx.rows, grad.size(1)).index_add_(0, plan.back_index, got)
        return out, None, None, None


def _exchange(send: Tensor, recv_counts: List[int], send_counts: List[int], stats: Optional[CommStats],
              kind: str, group) -> Tensor:
    recv = send.new_empty(sum(recv_counts), send.size(1))
    if stats is None:
        dist.all_to_all_single(recv, send, recv_counts, send_counts, group=group)
        return recv
    with stats.waiting():
        dist.all_to_all_single(recv, send, recv_counts, send_counts, group=group)
    stats.record(kind, sent=nbytes(send), recv=nbytes(recv))
    return recv
