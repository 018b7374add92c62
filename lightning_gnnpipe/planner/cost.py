"""Planner (first version): estimate epoch time and bytes of each layout and recommend one.

A cost model, not a measurement: per-epoch time = compute + communication, where

* compute comes from forward+backward seconds per layer measured on one process: on every chunk of the layout's plan,
  as its ranks run them (``chunk_seconds``, :func:`measure_chunk_seconds`), or on the full graph
  (:func:`measure_layer_seconds`), scaled by the rows whose outputs a rank computes (inner rows on the CSR path;
  inner plus halo rows on the edge-list path, ``halo_rows_computed``). A chunk's time need not be its share of the
  whole graph's: on one CPU core the 16 METIS chunks of a 300k-node graph ran GCNII-16 in 0.70x the time of its 2
  partitions (docs/results/notes/time_to_accuracy.md; their rows stay in cache), and a GPU runs small chunks below its
  throughput;
* GNNPipe (``S`` stages, ``K`` chunks) runs its slowest stage ``(K + S - 1) / K`` times (GPipe's
  fill and drain bubble, Huang et al., arXiv 1811.06965);
* communication is the analytic byte count of :mod:`lightning_gnnpipe.planner.volume` divided by a
  measured (:func:`measure_bandwidth`) or assumed point-to-point bandwidth (bytes per second), each rank sending its share in
  parallel (or, with ``shared_link``, all of it over one link), with no overlap of communication and compute (a
  conservative bound);
* hybrid (``S`` stages x ``G`` partitions, ``S G = P``) runs each pipeline on its partition's
  ``K / G`` chunks, so its compute is the busiest partition's chunks through its slowest stage with
  ``(K/G + S - 1) / (K/G)`` for the bubble.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch import Tensor, nn

from lightning_gnnpipe.planner.volume import graph_parallel_volume, hybrid_volume, pipeline_volume
from lightning_gnnpipe.data.chunk import ChunkPlan, build_chunk_plan
from lightning_gnnpipe.data.partition import nested_partition
from lightning_gnnpipe.pipeline.balance import profile_chunk_costs
from lightning_gnnpipe.pipeline.split import split_layers

ChunkSeconds = Callable[[ChunkPlan], Sequence[Sequence[float]]]
"""Forward+backward seconds of every layer on every chunk of a plan: ``(K, L)``, chunk by chunk."""


@dataclass
class LayoutEstimate:
    """Estimated cost of one layout.

    Attributes:
        mode: ``"gnnpipe"``, ``"graph_parallel"`` or ``"hybrid"``.
        stages: ``S``. graph_parallel: ``G``. chunks: ``K`` (``G`` for graph parallelism).
        bytes_per_epoch: Bytes sent per epoch, all ranks together.
        compute_seconds: Slowest rank's compute per epoch, bubble included (seconds).
        comm_seconds: Communication per epoch (seconds).
    """

    mode: str
    stages: int
    graph_parallel: int
    chunks: int
    bytes_per_epoch: int
    compute_seconds: float
    comm_seconds: float

    @property
    def seconds(self) -> float:
        """Estimated epoch time (seconds)."""
        return self.compute_seconds + self.comm_seconds


def _work_ratio(plan: ChunkPlan, halo_rows_computed: bool = True) -> List[float]:
    """Per chunk: rows whose outputs it computes over ``|V|``: inner rows, plus halo rows when blocks compute them."""
    n = plan.num_nodes
    return [(int(a.numel()) + (int(b.numel()) if halo_rows_computed else 0)) / n for a, b in zip(plan.nodes, plan.halo)]


def layout_plan(edge_index: Tensor, num_nodes: int, num_chunks: int, num_parts: int = 1) -> ChunkPlan:
    """Return the chunk plan a layout trains on: ``K`` METIS chunks, or with ``G = num_parts > 1`` (hybrid) ``G``
    partitions of ``K / G`` chunks each, chunk ``c`` in partition ``c % G``
    (:func:`~lightning_gnnpipe.data.partition.nested_partition`)."""
    part = nested_partition(edge_index, num_nodes, num_parts, num_chunks // num_parts) if num_parts > 1 else None
    return build_chunk_plan(edge_index, num_nodes, num_chunks, part=part)


def _takes_num_parts(plan_fn: Callable) -> bool:
    try:
        params = inspect.signature(plan_fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read: let the call tell
        return True
    return any(p.name == "num_parts" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def estimate_layouts(
    edge_index: Tensor,
    num_nodes: int,
    dims: Sequence[int],
    layer_seconds: Optional[Sequence[float]],
    num_processes: int,
    bandwidth: float,
    chunks_per_stage: Sequence[int] = (2, 4, 8),
    num_params: int = 0,
    num_param_tensors: int = 0,
    plan_fn: Callable[..., ChunkPlan] = layout_plan,
    shared_link: bool = False,
    halo_rows_computed: bool = False,
    chunk_seconds: Optional[ChunkSeconds] = None,
) -> List[LayoutEstimate]:
    """Estimate GNNPipe (``S = P``), graph parallelism (``G = P``) and hybrid (``S G = P``) on ``P`` processes.

    Args:
        edge_index: Edges ``(2, |E|)``.
        num_nodes: ``|V|``.
        dims: Width entering each layer and leaving the last, ``L + 1`` ints.
        layer_seconds: Full-graph forward+backward time of each layer on one process (seconds), scaled to each chunk
            by its rows; ``None`` with ``chunk_seconds``.
        num_processes: ``P``.
        bandwidth: Point-to-point bandwidth (bytes per second).
        chunks_per_stage: GNNPipe candidates ``K = k * S`` (hybrid: ``K = k * S * G``).
        num_params, num_param_tensors: Trainable values and tensors (graph parallelism's all-reduce).
        plan_fn: Returns the chunk plan of every candidate: ``plan_fn(edge_index, num_nodes, K)`` for GNNPipe and graph
            parallelism, ``plan_fn(edge_index, num_nodes, K, num_parts=G)`` for hybrid layouts (chunk ``c`` in
            partition ``c % G``). Default :func:`layout_plan`; pass a cached one to plan each ``K`` once.
        shared_link: Every rank's traffic, in both directions, passes one link of ``bandwidth`` (one shared switch
            port or medium, or an emulated link such as a shaped loopback): communication is all bytes over
            ``bandwidth``, for every layout. Default ``False``: each rank sends its share over its own
            point-to-point link in parallel (graph parallelism's ``P`` ranks at once, a pipeline's ``P - 1``
            boundaries at once).
        halo_rows_computed: Whether a block computes outputs for a chunk's halo rows too, so that a chunk costs
            ``(n_c + h_c) / |V|`` of a full-graph layer: the edge-list path (GAT, PNA, any block under
            ``bf16-mixed``). Default ``False``: the CSR path (GCN, GraphSAGE, GIN, GraphConv, GCNII convs,
            :mod:`~lightning_gnnpipe.nn.chunk_call`) computes only the inner rows, so a chunk costs ``n_c / |V|``.
        chunk_seconds: Measured seconds of every layer on every chunk of a plan (``(K, L)``,
            :func:`measure_chunk_seconds`), called once per candidate plan; when given, a stage's compute is the sum
            of its layers over the chunks it runs (a partition's for graph parallelism and hybrid) instead of
            ``layer_seconds`` scaled by rows, and ``halo_rows_computed`` is not used.

    Returns:
        Estimates sorted by estimated epoch time, fastest first.

    Raises:
        ValueError: If ``len(layer_seconds) != len(dims) - 1``, neither ``layer_seconds`` nor ``chunk_seconds`` is
            given, ``chunk_seconds`` returns other than ``(K, L)`` for a plan of ``K`` chunks, or ``bandwidth <= 0``.
        TypeError: If hybrid layouts are estimated (``P`` has a divisor ``G`` in ``[2, P)`` with ``P / G <= L``) and
            ``plan_fn`` takes no ``num_parts``.
    """
    num_layers = len(dims) - 1
    if layer_seconds is None and chunk_seconds is None:
        raise ValueError("estimate_layouts: give `layer_seconds` (full-graph seconds per layer) or `chunk_seconds` "
                         "(seconds per chunk and layer of a plan) (got neither).")
    if layer_seconds is not None and len(layer_seconds) != num_layers:
        raise ValueError(f"estimate_layouts: need one time per layer, {num_layers} (got {len(layer_seconds)}).")
    if bandwidth <= 0:
        raise ValueError(f"estimate_layouts: `bandwidth` must be > 0 bytes/s (got {bandwidth}).")
    p = num_processes
    hybrid = [g for g in range(2, p) if p % g == 0 and p // g <= num_layers]
    if hybrid and not _takes_num_parts(plan_fn):
        raise TypeError(f"estimate_layouts: `plan_fn` takes no `num_parts`, which the hybrid layouts of {p} processes "
                        f"need (G in {hybrid}) (got {getattr(plan_fn, '__name__', plan_fn)!r}). Accept `num_parts` "
                        "(chunk c in partition c % G, as `layout_plan`), or estimate fewer processes.")
    out: List[LayoutEstimate] = []
    if p <= num_layers:
        stages = split_layers(num_layers, p)
        for k in chunks_per_stage:
            plan = plan_fn(edge_index, num_nodes, k * p)
            costs = _chunk_stage_seconds(plan, stages, layer_seconds, chunk_seconds, halo_rows_computed)
            slowest = max(sum(column) for column in zip(*costs))  # the stage that takes longest over all chunks
            compute = slowest * (plan.num_chunks + p - 1) / plan.num_chunks
            volume = sum(pipeline_volume(plan, list(dims), p).values())
            out.append(LayoutEstimate("gnnpipe", p, 1, plan.num_chunks, volume, compute,
                                      _link_seconds(volume, max(p - 1, 1), bandwidth, shared_link) if p > 1 else 0.0))
    plan = plan_fn(edge_index, num_nodes, p)
    compute = max(row[0] for row in _chunk_stage_seconds(plan, [list(range(num_layers))], layer_seconds,
                                                         chunk_seconds, halo_rows_computed))
    graph_layers = [True] * num_layers
    volume = sum(graph_parallel_volume(plan, list(dims), graph_layers, num_params, num_param_tensors).values())
    out.append(LayoutEstimate("graph_parallel", 1, p, p, volume, compute,
                              _link_seconds(volume, p, bandwidth, shared_link) if p > 1 else 0.0))
    for g in hybrid:
        out += _hybrid_estimates(edge_index, num_nodes, list(dims), layer_seconds, p // g, g, bandwidth,
                                 chunks_per_stage, num_params + num_param_tensors, plan_fn, shared_link,
                                 halo_rows_computed, chunk_seconds)
    return sorted(out, key=lambda e: e.seconds)


def _hybrid_estimates(edge_index: Tensor, num_nodes: int, dims: List[int], layer_seconds: Optional[Sequence[float]],
                      s: int, g: int, bandwidth: float, chunks_per_stage: Sequence[int],
                      flat_params: int, plan_fn: Callable[..., ChunkPlan],
                      shared_link: bool = False, halo_rows_computed: bool = True,
                      chunk_seconds: Optional[ChunkSeconds] = None) -> List[LayoutEstimate]:
    stages = split_layers(len(dims) - 1, s)
    out = []
    for k in chunks_per_stage:
        chunks = k * s * g
        plan = plan_fn(edge_index, num_nodes, chunks, num_parts=g)
        costs = _chunk_stage_seconds(plan, stages, layer_seconds, chunk_seconds, halo_rows_computed)
        # the busiest pipeline's slowest stage, over its partition's chunks (chunk c in partition c % G)
        busiest = max(sum(costs[c][st] for c in range(q, chunks, g)) for q in range(g) for st in range(s))
        micro = chunks // g
        compute = busiest * (micro + s - 1) / micro
        volume = sum(hybrid_volume(plan, dims, s, g, [True] * (len(dims) - 1), [flat_params // s] * s).values())
        out.append(LayoutEstimate("hybrid", s, g, chunks, volume, compute,
                                  _link_seconds(volume, s * g, bandwidth, shared_link)))
    return out


def _chunk_stage_seconds(plan: ChunkPlan, stages: Sequence[Sequence[int]], layer_seconds: Optional[Sequence[float]],
                         chunk_seconds: Optional[ChunkSeconds], halo_rows_computed: bool) -> List[List[float]]:
    """Seconds of each stage's layers on each chunk of ``plan``, ``(K, S)``: measured (``chunk_seconds``), else the
    full-graph ``layer_seconds`` times the chunk's share of the rows (:func:`_work_ratio`)."""
    num_layers = sum(len(st) for st in stages)
    if chunk_seconds is None:
        assert layer_seconds is not None
        rows = [[layer_seconds[i] * r for i in range(num_layers)] for r in _work_ratio(plan, halo_rows_computed)]
    else:
        rows = [[float(t) for t in row] for row in chunk_seconds(plan)]
        if len(rows) != plan.num_chunks or any(len(row) != num_layers for row in rows):
            raise ValueError(f"estimate_layouts: `chunk_seconds` must give one time per layer ({num_layers}) for each "
                             f"of the plan's {plan.num_chunks} chunks (got {[len(row) for row in rows]}).")
    return [[sum(row[i] for i in st) for st in stages] for row in rows]


def _link_seconds(volume: float, senders: int, bandwidth: float, shared_link: bool) -> float:
    """Seconds to send ``volume`` bytes: over one shared link, or ``senders`` links in parallel."""
    return volume / bandwidth if shared_link else volume / senders / bandwidth


def backend_device(backend: str) -> torch.device:
    """The device whose tensors a process group of ``backend`` exchanges: CUDA (the current device) for NCCL.

    Args:
        backend: ``torch.distributed.get_backend(group)``, e.g. ``"gloo"``, ``"nccl"`` or ``"cpu:gloo,cuda:nccl"``.

    Returns:
        ``torch.device("cuda")`` when the backend includes NCCL (which refuses CPU tensors), else the CPU.
    """
    return torch.device("cuda") if "nccl" in str(backend).lower() else torch.device("cpu")


def measure_bandwidth(nbytes: int = 1 << 24, repeats: int = 5, group=None, device=None) -> float:
    """Measure point-to-point bandwidth between the first two ranks of ``group`` (bytes per second).

    A collective: every rank of ``group`` calls it. Ranks 0 and 1 exchange a ``nbytes`` float32 buffer
    back and forth ``repeats`` times (``send``/``recv`` of the process group's backend, as the pipeline's
    P2P transfers); the best round trip gives ``2 * nbytes / seconds``. The result is broadcast, so every
    rank returns the same value. With one rank there is no link: returns ``inf``. On a CUDA buffer each round
    trip ends with ``torch.cuda.synchronize``, so the time is the transfer's, not the launch's.

    Args:
        nbytes: Size of the exchanged buffer (bytes).
        repeats: Round trips; the fastest is kept.
        group: Process group (default: the world).
        device: Device of the buffers; default: the group backend's (:func:`backend_device`: this rank's current
            CUDA device under NCCL, the CPU under gloo).

    Returns:
        Bandwidth in bytes per second (``inf`` with one rank).

    Raises:
        ValueError: If ``nbytes < 4`` or ``repeats < 1``.
    """
    import torch.distributed as dist

    if nbytes < 4 or repeats < 1:
        raise ValueError(f"measure_bandwidth: need nbytes >= 4 and repeats >= 1 (got {nbytes}, {repeats}).")
    world = dist.get_world_size(group)
    if world < 2:
        return float("inf")
    rank = dist.get_rank(group)
    peer = lambda r: dist.get_global_rank(group, r) if group is not None else r  # noqa: E731
    buf = torch.zeros(nbytes // 4, device=device if device is not None else backend_device(dist.get_backend(group)))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        if rank == 0:
            dist.send(buf, peer(1), group=group)
            dist.recv(buf, peer(1), group=group)
        elif rank == 1:
            dist.recv(buf, peer(0), group=group)
            dist.send(buf, peer(0), group=group)
        _synchronize(buf)
        best = min(best, time.perf_counter() - start)
    result = torch.tensor([2 * (nbytes // 4) * 4 / best if rank == 0 else 0.0], dtype=torch.float64,
                          device=buf.device)
    dist.broadcast(result, peer(0), group=group)
    return float(result)


def _synchronize(t: Tensor) -> None:
    if t.is_cuda:
        torch.cuda.synchronize(t.device)


def measure_layer_seconds(blocks: Sequence[nn.Module], x: Tensor, edge_index: Tensor, repeats: int = 3) -> List[float]:
    """Time each block's full-graph forward+backward on one process (best of ``repeats``, seconds)."""
    out: List[float] = []
    h = x
    for block in blocks:
        best: Optional[float] = None
        for _ in range(repeats):
            inp = h.detach().requires_grad_(h.is_floating_point())
            _synchronize(inp)
            start = time.perf_counter()
            y = block(inp, edge_index)
            y.float().sum().backward()
            _synchronize(inp)  # on CUDA: the kernels' time, not their launches'
            elapsed = time.perf_counter() - start
            best = elapsed if best is None else min(best, elapsed)
        for prm in block.parameters():
            prm.grad = None
        with torch.no_grad():
            h = block(h, edge_index)
        out.append(float(best))
    return out


def measure_chunk_seconds(blocks: Sequence[nn.Module], x: Tensor, edge_index: Tensor,
                          repeats: int = 1) -> ChunkSeconds:
    """Return ``chunk_seconds`` for :func:`estimate_layouts`: for a plan, each block's forward+backward seconds on
    each of its chunks, run as a stage runs it (inner and halo rows, the chunk's own adjacency; best of ``repeats``
    after one warm-up, :func:`~lightning_gnnpipe.pipeline.balance.profile_chunk_costs`).

    On one process and its threads: set ``torch.set_num_threads`` to what a rank will have. A plan costs about
    ``repeats + 1`` training epochs.

    Args:
        blocks: The model's ``L`` layer blocks.
        x: Node features ``(|V|, F)``, on the device to measure on.
        edge_index: Edges of the whole graph ``(2, |E|)``.
        repeats: Timed runs per chunk and block, at least 1.

    Returns:
        A function of a :class:`~lightning_gnnpipe.data.chunk.ChunkPlan` that measures and returns its ``(K, L)``
        seconds (a list per chunk).

    Raises:
        ValueError: If ``repeats < 1``.
    """
    if repeats < 1:
        raise ValueError(f"measure_chunk_seconds: `repeats` must be >= 1 timed runs (got {repeats}).")
    return lambda plan: profile_chunk_costs(list(blocks), plan, edge_index, x, repeats=repeats)


def format_table(estimates: List[LayoutEstimate]) -> str:
    """Render estimates as a markdown table (bytes in MiB, times in seconds); the first row is recommended."""
    lines = ["| mode | S | G | K | MiB/epoch | compute s | comm s | epoch s |", "|---|---|---|---|---|---|---|---|"]
    for i, e in enumerate(estimates):
        mark = " (recommended)" if i == 0 else ""
        lines.append(f"| {e.mode}{mark} | {e.stages} | {e.graph_parallel} | {e.chunks} | "
                     f"{e.bytes_per_epoch / 2**20:.1f} | {e.compute_seconds:.3f} | {e.comm_seconds:.3f} | "
                     f"{e.seconds:.3f} |")
    return "\n".join(lines)


def recommend(estimates: List[LayoutEstimate]) -> Dict[str, int]:
    """Return the fastest layout as ``{"mode", "stages", "graph_parallel", "chunks"}`` keyword values."""
    best = estimates[0]
    return {"mode": best.mode, "stages": best.stages, "graph_parallel": best.graph_parallel,  # type: ignore[dict-item]
            "chunks": best.chunks}
