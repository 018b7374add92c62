"""Halo exchange between graph partitions, forward (embeddings) and backward (gradients).

Graph parallelism (e.g. DistGNN, arXiv 2104.06700; the baseline of GNNPipe, arXiv 2308.10087,
Sec. 2): each of ``G`` ranks owns one part of a METIS partition. Before every message-passing
layer, rank ``r`` needs the current embeddings of its halo (the out-of-part in-neighbours of its
nodes); their owners send them with one ``all_to_all_single``. In the backward pass the
gradients of those halo rows travel the other way and are added to the owners' rows.
Both directions run inside one :class:`torch.autograd.Function` (:class:`RowExchange`), so the user's
loss drives them.
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
class HaloPlan:
    """What rank ``rank`` sends to and receives from every other rank in one halo exchange.

    Attributes:
        send_index: Local row ids (into this part's inner nodes) to send, grouped by
            destination rank in rank order, ``(sum(send_counts),)``.
        send_counts: Rows sent to each rank, ``G`` ints.
        recv_counts: Rows received from each rank, ``G`` ints (together ``|halo|``).
        recv_pos: Position in this part's halo (sorted by global id) of every received row,
            in arrival order, ``(|halo|,)``.
    """

    send_index: Tensor
    send_counts: List[int]
    recv_counts: List[int]
    recv_pos: Tensor

    @property
    def halo_size(self) -> int:
        return int(self.recv_pos.numel())

    # backward of RowExchange: every received row's gradient goes back to the rows that were sent
    back_sel = None

    @property
    def back_counts(self) -> List[int]:
        return self.recv_counts

    @property
    def back_index(self) -> Tensor:
        return self.send_index

    @property
    def back_recv_counts(self) -> List[int]:
        return self.send_counts

    def to(self, device: torch.device) -> "HaloPlan":
        return HaloPlan(self.send_index.to(device), self.send_counts, self.recv_counts, self.recv_pos.to(device))


def build_halo_plan(plan: ChunkPlan, rank: int) -> HaloPlan:
    """Derive rank ``rank``'s send and receive lists from a partition into ``G`` parts.

    Rank ``q`` sends the rows of ``nodes[q] ∩ halo[r]`` to rank ``r``, in increasing global id;
    rank ``r`` receives them in rank order and places them at their place in ``halo[r]``.

    Args:
        plan: The partition (a chunk plan with ``num_chunks = G``; part ``r`` = chunk ``r``).
        rank: This rank ``r``.
    """
    nodes, halo = plan.nodes[rank], plan.halo[rank]
    owner = plan.part[halo]
    send, send_counts, recv_counts, recv_pos = [], [], [], []
    for q in range(plan.num_chunks):
        rows = torch.isin(nodes, plan.halo[q]).nonzero().view(-1) if q != rank else nodes.new_zeros(0)
        send.append(rows)
        send_counts.append(int(rows.numel()))
        pos = (owner == q).nonzero().view(-1)
        recv_pos.append(pos)
        recv_counts.append(int(pos.numel()))
    return HaloPlan(torch.cat(send), send_counts, recv_counts, torch.cat(recv_pos))


class RowExchange(torch.autograd.Function):
    """``received = exchange(h)`` over ``all_to_all_single``; backward sends received rows' gradients back.

    ``plan`` provides ``send_index``/``send_counts`` (rows of ``h`` to send, grouped by destination),
    ``recv_counts``, and for the backward ``back_sel`` (received rows whose gradient goes back, ``None`` for
    all), ``back_counts`` (per source rank), ``back_index`` and ``back_recv_counts`` (rows of ``h`` that get
    gradients back, grouped by rank). Used by :class:`HaloPlan` (graph parallelism) and
    :class:`~lightning_gnnpipe.comm.slot_exchange.SlotPlan` (hybrid).

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


def exchange_halo(h: Tensor, plan: HaloPlan, stats: Optional[CommStats], group=None) -> Tensor:
    """Graph parallelism: the halo rows ``(|halo_r|, d)`` of this part from its inner rows ``h`` ``(n_r, d)``.

    Autograd-aware: in the backward pass the halo gradients are added to their owners' rows.
    """
    recv = RowExchange.apply(h, plan, stats, group)
    return recv.new_empty(plan.halo_size, h.size(1)).index_put((plan.recv_pos,), recv)


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
