"""Balance the stages by measured layer cost instead of by layer count.

A pipeline runs as fast as its slowest stage. Layers of one GNN can differ a lot in cost:
the first layer of a GCN on Cora maps 1433 input features, the others 64. With
``balance="time"`` the strategy measures every layer's forward+backward time on one chunk
(once, on rank 0, then broadcast so that all ranks cut the same way) and cuts the layers into
the contiguous runs that minimise the largest stage cost (the "linear partition" problem,
solved exactly by dynamic programming; GPipe and PipeDream balance stages the same way,
arXiv 1811.06965, arXiv 1806.03377).
"""

from __future__ import annotations

import time
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import Tensor, nn

from lightning_gnnpipe.data.chunk import ChunkPlan
from lightning_gnnpipe.nn.gcn_norm import norm_keys
from lightning_gnnpipe.nn.chunk_call import ChunkCaller, chunk_graph_options
from lightning_gnnpipe.nn.stack import call_block, infer_dims, takes_x0, uses_graph
from lightning_gnnpipe.data.chunk_graph import ChunkGraph, build_chunk_graph
from lightning_gnnpipe.pipeline.split import split_layers

BALANCES = ("count", "time")
"""Values of ``GNNPipeStrategy(balance=...)``."""


def check_balance(balance: object) -> str:
    """Return ``balance`` if it is a known mode.

    Raises:
        ValueError: If ``balance`` is not one of :data:`BALANCES`.
    """
    if balance not in BALANCES:
        raise ValueError(f"GNNPipeStrategy: unknown `balance` {balance!r}. Use one of {list(BALANCES)}.")
    return str(balance)


def balanced_split(costs: Sequence[float], num_stages: int) -> List[List[int]]:
    """Cut layers into ``num_stages`` contiguous runs minimising the largest run's total cost.

    Exact dynamic programme over (stages, prefix), ``O(S L^2)``. Among optimal cuts it returns
    the one whose earlier stages are as heavy as allowed (deterministic for equal inputs).

    Args:
        costs: Cost of each of the ``L`` layers (any unit, e.g. seconds), non-negative.
        num_stages: ``S``, ``1 <= S <= L``.

    Returns:
        ``S`` lists of layer indices, in order, together ``0 .. L-1``, none empty.

    Raises:
        ValueError: If ``S`` is not in ``[1, L]`` or a cost is negative or not finite.
    """
    n = len(costs)
    if num_stages < 1 or num_stages > n:
        split_layers(n, num_stages)  # raises its error message
    if not all(c >= 0 and c != float("inf") for c in costs):
        raise ValueError(f"balanced_split: costs must be finite and non-negative (got {list(costs)}).")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    inf = float("inf")
    # best[s][i]: the smallest possible largest cost when layers [0, i) go on s stages.
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, num_stages + 1):
        for i in range(s, n - (num_stages - s) + 1):
            for j in range(i - 1, s - 2, -1):  # last stage holds layers [j, i); latest j first
                value = max(best[s - 1][j], prefix[i] - prefix[j])
                if value < best[s][i]:
                    best[s][i], cut[s][i] = value, j
    out: List[List[int]] = []
    i = n
    for s in range(num_stages, 0, -1):
        j = cut[s][i]
        out.append(list(range(j, i)))
        i = j
    return out[::-1]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_layer_costs(
    blocks: List[nn.Module], plan: ChunkPlan, edge_index: Tensor, x: Tensor, chunk: int = 0, repeats: int = 5
) -> List[float]:
    """Measure each block's forward+backward time on one chunk, as a stage would run it
    (:func:`profile_chunk_costs` of that chunk).

    Args:
        blocks: The model's ``L`` layer blocks.
        plan: The chunk plan.
        edge_index: Edges of the whole graph ``(2, |E|)``.
        x: Node features ``(|V|, F)``, on the device to measure on.
        chunk: Which chunk to run.
        repeats: Timed runs per block after one warm-up round; the fastest is kept.

    Returns:
        ``L`` times in seconds.
    """
    return profile_chunk_costs(blocks, plan, edge_index, x, chunks=[chunk], repeats=repeats)[0]


@torch.enable_grad()
def profile_chunk_costs(blocks: List[nn.Module], plan: ChunkPlan, edge_index: Tensor, x: Tensor,
                        chunks: Optional[Sequence[int]] = None, repeats: int = 1) -> List[List[float]]:
    """Measure each block's forward+backward time on each chunk, as a stage would run it.

    A block that passes messages runs on the chunk's inner and halo rows, a node-wise block on
    the inner rows; layer 0 gets the real features, later layers random rows of their width
    (only shapes matter for time). No gradient is accumulated, and the blocks' buffers (e.g.
    BatchNorm running statistics) and the RNG state are restored afterwards.

    Args:
        blocks: The model's ``L`` layer blocks.
        plan: The chunk plan.
        edge_index: Edges of the whole graph ``(2, |E|)``.
        x: Node features ``(|V|, F)``, on the device to measure on.
        chunks: Which chunks to run (default: all ``K``).
        repeats: Timed runs per chunk and block after one warm-up round; the fastest is kept.

    Returns:
        For each chunk of ``chunks``, ``L`` times in seconds.

    Raises:
        ValueError: If ``repeats < 1`` or a chunk is not in ``[0, K)``.
    """
    picked = list(range(plan.num_chunks)) if chunks is None else list(chunks)
    if repeats < 1 or any(not 0 <= c < plan.num_chunks for c in picked):
        raise ValueError(f"profile_chunk_costs: need repeats >= 1 and chunks in [0, {plan.num_chunks}) (got repeats="
                         f"{repeats}, chunks={picked}).")
    device = x.device
    graph = build_chunk_graph(plan, edge_index, norm_keys(blocks), device, dtype=x.dtype, **chunk_graph_options(blocks))
    dims = infer_dims(blocks, x[:2])
    saved = [(t, t.detach().clone()) for b in blocks for t in b.buffers()]
    out: List[List[float]] = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for chunk in picked:
            times: List[List[float]] = [[] for _ in blocks]
            # Round-robin over the blocks, keeping each block's fastest run: a burst of load from
            # elsewhere then slows one run of every block instead of every run of one block.
            for r in range(repeats + 1):
                for j, block in enumerate(blocks):
                    seconds = _time_block(block, j, graph, chunk, dims[j], x, dims[min(1, len(dims) - 1)])
                    if r > 0:
                        times[j].append(seconds)
            out.append([min(t) for t in times])
    with torch.no_grad():
        for t, value in saved:
            t.copy_(value)
    return out


def _time_block(block: nn.Module, j: int, graph: ChunkGraph, chunk: int, in_channels: int, x: Tensor,
                x0_channels: int) -> float:
    """Seconds of one forward+backward of block ``j`` on chunk ``chunk``, as its stage runs it (a block that takes
    ``x0`` gets random inner rows of width ``x0_channels``)."""
    device = x.device
    nodes, halo = graph.nodes[chunk], graph.halo[chunk]
    graph_block = uses_graph(block)
    local = torch.cat([nodes, halo]) if graph_block else nodes
    ei = graph.edge_index[chunk] if graph_block else graph.edge_index[chunk][:, :0]
    h = x[local] if j == 0 else torch.randn(local.numel(), in_channels, device=device, dtype=x.dtype)
    h.requires_grad_(j > 0)
    inputs = ([h] if j > 0 else []) + [p for p in block.parameters() if p.requires_grad]
    h0 = torch.randn(nodes.numel(), x0_channels, device=device, dtype=x.dtype) if takes_x0(block) else None
    _sync(device)
    start = time.perf_counter()
    if graph_block:
        out = ChunkCaller(block, graph)(h, chunk, local, 0, h0)
    else:
        out = call_block(block, h, ei, h0)
    if inputs:
        torch.autograd.grad(out, inputs, grad_outputs=torch.ones_like(out), allow_unused=True)
    _sync(device)
    return time.perf_counter() - start


def stage_layers(
    balance: str, blocks: List[nn.Module], num_stages: int, plan: ChunkPlan, edge_index: Tensor, x: Tensor
) -> List[List[int]]:
    """Return the layers of every stage: equal counts, or balanced by time measured on rank 0.

    With ``balance="time"`` rank 0 profiles (:func:`profile_layer_costs`) and broadcasts the
    costs, so every rank computes the same cut.

    Args:
        balance: ``"count"`` or ``"time"``.
        blocks: The model's ``L`` layer blocks.
        num_stages: ``S``.
        plan: The chunk plan.
        edge_index: Edges of the whole graph ``(2, |E|)``.
        x: Node features ``(|V|, F)`` on this rank's device.
    """
    if check_balance(balance) == "count":
        return split_layers(len(blocks), num_stages)
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    costs: Optional[List[float]] = profile_layer_costs(blocks, plan, edge_index, x) if rank == 0 else None
    if dist.is_available() and dist.is_initialized():
        box = [costs]
        dist.broadcast_object_list(box, src=0)
        costs = box[0]
    assert costs is not None
    layers = balanced_split(costs, num_stages)
    stage_ms = [round(1e3 * sum(costs[i] for i in run), 2) for run in layers]
    rank_zero_info(
        f"GNNPipeStrategy: balance='time': layer forward+backward on one chunk (ms) "
        f"{[round(1e3 * c, 2) for c in costs]}; stage -> layers {layers}, stage cost (ms) {stage_ms}"
    )
    return layers
