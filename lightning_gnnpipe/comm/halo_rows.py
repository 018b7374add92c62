"""The exact whole-graph forward over several ranks: each computes the rows of its own group of chunks, layer by
layer, and receives its halo's rows from their owners between layers.

This is graph parallelism's forward (e.g. DistGNN, arXiv 2104.06700) without gradients. The hybrid's partitions run
their exact forward this way (:class:`~lightning_gnnpipe.comm.partitions.PartitionExchange`). GNNPipe's
graph-parallel evaluation (:class:`~lightning_gnnpipe.strategy.graph_parallel_eval.GraphParallelEvaluation`) merges
each stage rank's group of chunks into one part with :func:`chunk_groups` and :func:`group_plan`.

A group's halo is every row outside the group that an edge leads from into it. :class:`HaloRows` holds, for one
rank, which of its rows each other rank reads and which rows it receives, so that one ``all_to_all_single`` per layer
moves each halo row once (``H_g x d`` received per layer), and :meth:`HaloRows.gather` gives the last layer's rows of
every group to every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from lightning_gnnpipe.data.chunk import ChunkPlan


def group_halos(plan: ChunkPlan, groups: Sequence[Sequence[int]]) -> List[Tensor]:
    """Halo of every group of chunks: the sorted ids of out-of-group nodes with an edge into the group.

    Args:
        plan: The chunk plan.
        groups: Disjoint lists of chunk ids covering ``range(K)``.

    Returns:
        One ``(H_g,)`` ``torch.long`` tensor per group.
    """
    owner = torch.empty(plan.num_chunks, dtype=torch.long)
    for g, chunks in enumerate(groups):
        owner[list(chunks)] = g
    halos = []
    for g, chunks in enumerate(groups):
        rows = torch.unique(torch.cat([plan.halo[c] for c in chunks])) if chunks else plan.part[:0]
        halos.append(rows[owner[plan.part[rows]] != g])
    return halos


def chunk_groups(plan: ChunkPlan, num_groups: int) -> List[List[int]]:
    """Split the ``K`` chunks into ``num_groups`` groups of ``K // num_groups`` or one more, keeping chunks that read
    each other's rows together (greedy: each group grows by the chunk that shares the most halo rows with it).

    Raises:
        ValueError: ``num_groups`` is not in ``[1, K]``.
    """
    k = plan.num_chunks
    if not 1 <= num_groups <= k:
        raise ValueError(f"chunk_groups: `num_groups` must be in [1, {k}] for {k} chunks (got {num_groups}).")
    # shared[a, b]: rows of chunk a in chunk b's halo, plus the other way round
    shared = torch.zeros(k, k, dtype=torch.long)
    for b in range(k):
        shared[:, b] += torch.bincount(plan.part[plan.halo[b]], minlength=k)
    shared = shared + shared.T
    left, groups = list(range(k)), []
    for g in range(num_groups):
        size = k // num_groups + (g < k % num_groups)
        group = [left.pop(0)]
        while len(group) < size:
            best = max(left, key=lambda c: int(shared[c, group].sum()))
            left.remove(best)
            group.append(best)
        groups.append(sorted(group))
    return groups


@dataclass
class HaloRows:
    """One rank's rows of the exact forward's exchange: the nodes of its group ``own`` (sorted), the ones each other
    rank reads (``send_ids``, grouped by destination, ``send_counts``) and the halo rows it receives (``recv_ids``,
    grouped by source, ``recv_counts``). Sender and receiver compute each list alike (sorted ids)."""

    own: Tensor
    send_ids: Tensor
    send_counts: List[int]
    recv_ids: Tensor
    recv_counts: List[int]

    @staticmethod
    def build(plan: ChunkPlan, groups: Sequence[Sequence[int]], part: int, device: Optional[torch.device] = None,
              halos: Optional[List[Tensor]] = None) -> "HaloRows":
        """The exchange of group ``part`` of ``groups`` (``halos``: :func:`group_halos` of them, if computed)."""
        halos = group_halos(plan, groups) if halos is None else halos
        nodes = [torch.cat([plan.nodes[c] for c in chunks]).sort().values if chunks else plan.part[:0]
                 for chunks in groups]
        empty = nodes[part][:0]
        send = [nodes[part][torch.isin(nodes[part], halos[q])] if q != part else empty for q in range(len(groups))]
        recv = [nodes[q][torch.isin(nodes[q], halos[part])] if q != part else empty for q in range(len(groups))]
        to = (lambda t: t.to(device)) if device is not None else (lambda t: t)  # noqa: E731
        return HaloRows(to(nodes[part]), to(torch.cat(send)), [int(t.numel()) for t in send], to(torch.cat(recv)),
                        [int(t.numel()) for t in recv])

    def share(self, out: Tensor, group=None) -> Tensor:
        """Complete a layer's output ``out`` ``(|V|, d)``, which holds this group's rows (others zero or stale), with
        the rows of this group's halo, received from their owners (one ``all_to_all_single`` over ``group``, each
        halo row once); return ``out``. The next layer of this group's chunks then reads exact rows only."""
        recv = out.new_empty(self.recv_ids.numel(), out.size(1))
        dist.all_to_all_single(recv, out.index_select(0, self.send_ids).contiguous(), self.recv_counts,
                               self.send_counts, group=group)
        return out.index_copy_(0, self.recv_ids, recv)

    def gather(self, out: Tensor, group=None) -> Tensor:
        """The whole graph's result ``(|V|, d)`` on every rank of ``group`` from each group's own rows of ``out``
        (other rows ignored): one all-reduce of ``|V| x d``."""
        full = out.new_zeros(out.shape).index_copy_(0, self.own, out.index_select(0, self.own))
        dist.all_reduce(full, group=group)
        return full


def group_plan(plan: ChunkPlan, groups: Sequence[Sequence[int]]) -> ChunkPlan:
    """The plan whose chunk ``g`` is the union of ``groups[g]``'s chunks, with that union's halo
    (:func:`group_halos`); its ``edge_cut`` is the original plan's (not recounted)."""
    owner = torch.empty(plan.num_chunks, dtype=torch.long)
    for g, chunks in enumerate(groups):
        owner[list(chunks)] = g
    nodes = [torch.cat([plan.nodes[c] for c in chunks]).sort().values for chunks in groups]
    return ChunkPlan(owner[plan.part], nodes, group_halos(plan, groups), plan.edge_cut, plan.degrees)
