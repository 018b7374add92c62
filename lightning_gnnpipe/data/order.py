"""Chunk order and how stale the halo reads are under it.

Chunks run through every stage in the order ``0..K-1``. A halo row of chunk ``c`` that belongs to chunk
``c' < c`` is read fresh (written earlier in the same epoch); one that belongs to ``c' > c`` is read from the
previous epoch (GNNPipe, arXiv 2308.10087, Sec. 4.2). Ordering the chunks so that most cross-chunk edges point
forward maximises fresh reads: a maximum acyclic subgraph (minimum feedback arc set) problem on the chunk
dependency graph, solved here greedily (Eades, Lin and Smyth, "A fast and effective heuristic for the feedback arc
set problem", IPL 1993).
"""

from __future__ import annotations

from typing import List, Tuple

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


def greedy_chunk_order(plan: ChunkPlan, edge_index: Tensor) -> List[int]:
    """Order chunks so that many cross-chunk edges go from an earlier to a later chunk.

    Eades-Lin-Smyth greedy: repeatedly place next the remaining chunk with the largest
    (out-weight - in-weight) towards the remaining chunks.

    Returns:
        A permutation of ``range(K)``: ``order[i]`` is the chunk that runs ``i``-th.
    """
    w = chunk_dependencies(plan, edge_index).double()
    remaining = list(range(plan.num_chunks))
    order: List[int] = []
    while remaining:
        idx = torch.tensor(remaining)
        sub = w[idx][:, idx]
        score = sub.sum(1) - sub.sum(0)
        best = remaining[int(score.argmax())]
        order.append(best)
        remaining.remove(best)
    return order


def stale_read_stats(plan: ChunkPlan, edge_index: Tensor) -> Tuple[float, float]:
    """Return ``(stale_fraction, mean_age)`` of halo reads per layer (layers >= 1) in chunk order.

    ``stale_fraction``: edges whose source is read historical, over all edges (unitless).
    ``mean_age``: mean age of those rows when read, in epochs (a row of chunk ``c'`` read by chunk
    ``c < c'`` was written ``(K - c' + c) / K`` epochs earlier). ``0.0`` if nothing is stale.
    """
    if edge_index.numel() == 0:
        return 0.0, 0.0
    src, dst = plan.part[edge_index[0]], plan.part[edge_index[1]]
    stale = src > dst
    if not bool(stale.any()):
        return 0.0, 0.0
    k = plan.num_chunks
    age = (k - src[stale] + dst[stale]).double() / k
    return float(stale.double().mean()), float(age.mean())
