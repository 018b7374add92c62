"""Chunk order and how stale the halo reads are under it.

Chunks run through every stage in the order ``0..K-1``. A halo row of chunk ``c`` that belongs to chunk
``c' < c`` is read fresh (written earlier in the same epoch); one that belongs to ``c' > c`` is read from the
previous epoch (GNNPipe, arXiv 2308.10087, Sec. 4.2). Ordering the chunks so that most cross-chunk edges point
forward maximises fresh reads: a maximum acyclic subgraph (minimum feedback arc set) problem on the chunk
dependency graph, solved here greedily (Eades, Lin and Smyth, "A fast and effective heuristic for the feedback arc
set problem", IPL 1993).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from lightning_gnnpipe.data.chunk import ChunkPlan


def chunk_dependencies(plan: ChunkPlan, edge_index: Tensor) -> Tensor:
    """Count edges between chunks: ``W[a, b]`` = edges from a node of chunk ``a`` into chunk ``b``, ``(K, K)``."""
    k = plan.num_chunks
    src, dst = plan.part[edge_index[0]], plan.part[edge_index[1]]
    cross = src != dst
    w = torch.bincount(src[cross] * k + dst[cross], minlength=k * k)
    return w.view(k, k)


def _greedy(w: Tensor) -> List[int]:
    """Eades-Lin-Smyth greedy order of the nodes of a weighted digraph ``w`` ``(n, n)``."""
    remaining = list(range(w.size(0)))
    order: List[int] = []
    while remaining:
        idx = torch.tensor(remaining)
        sub = w[idx][:, idx]
        score = sub.sum(1) - sub.sum(0)
        best = remaining[int(score.argmax())]
        order.append(best)
        remaining.remove(best)
    return order


def greedy_chunk_order(plan: ChunkPlan, edge_index: Tensor, num_parts: int = 1) -> List[int]:
    """Order chunks so that many cross-chunk edges go from an earlier to a later chunk.

    Eades-Lin-Smyth greedy: repeatedly place next the remaining chunk with the largest
    (out-weight - in-weight) towards the remaining chunks. With ``num_parts = G > 1`` (hybrid
    parallelism, chunk ``j * G + g`` is the ``j``-th chunk of partition ``g``), the chunks of each
    partition are ordered among themselves and the slot-major layout is kept.

    Returns:
        A permutation of ``range(K)``: ``order[i]`` is the chunk that runs ``i``-th.
    """
    w = chunk_dependencies(plan, edge_index).double()
    if num_parts == 1:
        return _greedy(w)
    order = [0] * plan.num_chunks
    for g in range(num_parts):
        members = list(range(g, plan.num_chunks, num_parts))
        idx = torch.tensor(members)
        for j, local in enumerate(_greedy(w[idx][:, idx])):
            order[j * num_parts + g] = members[local]
    return order


def edge_counts(plan: ChunkPlan, edge_index: Tensor) -> Tensor:
    """Count every edge by chunk: ``W[a, b]`` = edges from a node of chunk ``a`` into chunk ``b``, the diagonal
    included (the edges inside a chunk), ``(K, K)``."""
    k = plan.num_chunks
    return torch.bincount(plan.part[edge_index[0]] * k + plan.part[edge_index[1]], minlength=k * k).view(k, k)


def read_stats(counts: Tensor, now: Tensor, before: Tensor, slots: int) -> Tuple[float, float]:
    """``(stale_fraction, mean_age)`` of the halo reads of an epoch, from the chunks' positions in it.

    An edge from chunk ``a`` into chunk ``b`` is read historical (last epoch's row) when ``a``'s slot runs after
    ``b``'s in this epoch; chunks of one slot (hybrid parallelism) read each other live.

    Args:
        counts: Edges between chunks ``(K, K)``, the diagonal included (:func:`edge_counts`).
        now: Position of every chunk's slot in this epoch ``(K,)``, in ``0 .. slots - 1``.
        before: The same in the epoch before ``(K,)``.
        slots: Slots an epoch (``K / G``).

    Returns:
        ``stale_fraction``: edges read historical over all edges (unitless); ``mean_age``: their rows' mean age in
        epochs, ``1 + (now[b] - before[a]) / slots`` for a row of ``a`` written at ``before[a]`` and read at
        ``now[b]``; ``0.0`` if nothing is stale.
    """
    total = float(counts.sum())
    stale = now.view(-1, 1) > now.view(1, -1)  # [a, b]: a's slot runs after b's
    weights = counts.double() * stale
    n = float(weights.sum())
    if total == 0 or n == 0:
        return 0.0, 0.0
    age = 1 + (now.view(1, -1) - before.view(-1, 1)).double() / slots
    return n / total, float((weights * age).sum()) / n


def stale_read_stats(plan: ChunkPlan, edge_index: Optional[Tensor], num_parts: int = 1, reverse: bool = False,
                     alternating: bool = False, counts: Optional[Tensor] = None) -> Tuple[float, float]:
    """Return ``(stale_fraction, mean_age)`` of halo reads per layer (layers >= 1) in one epoch's chunk order.

    With ``num_parts = G > 1`` (hybrid), chunk ``c`` runs in slot ``c // G`` and rows of chunks of the
    same slot arrive by halo exchange (fresh), so a read is stale when the source's slot is later.

    Args:
        plan: The chunk plan (chunk ``c`` runs ``c``-th, or in slot ``c // G``).
        edge_index: Edges ``(2, |E|)``, source row first.
        num_parts: ``G``.
        reverse: The epoch runs the chunks in reverse order (the odd epochs of ``halo_gradients="fresh"``).
        alternating: The epoch before ran them in the other order (``halo_gradients="fresh"``).
        counts: :func:`edge_counts` of the graph, in place of ``edge_index`` (a partitioned graph saves them).

    Returns:
        ``stale_fraction``: edges whose source is read historical (its chunk runs later in the epoch), over all
        edges (unitless). ``mean_age``: mean age of those rows when read, in epochs: a row written at position ``q``
        of the epoch before and read at position ``p`` is ``1 + (p - q) / K`` epochs old (in one fixed order, a row
        of chunk ``c'`` read by chunk ``c < c'`` was written ``(K - c' + c) / K`` epochs earlier). ``0.0`` if nothing
        is stale.
    """
    counts = edge_counts(plan, edge_index) if counts is None else counts
    if int(counts.sum()) == 0:
        return 0.0, 0.0
    k = plan.num_chunks // num_parts
    slot = torch.arange(plan.num_chunks) // num_parts
    now = k - 1 - slot if reverse else slot
    before = k - 1 - now if alternating else now
    return read_stats(counts, now, before, k)
