"""The package planner's predictions beside the measured runs, from chunk times measured on this machine.

    python -m benchmarks.time_to_accuracy.bench --only planner   # measure what chunk_seconds.jsonl lacks

For each model and graph, :func:`~lightning_gnnpipe.planner.cost.measure_chunk_seconds` times every layer's
forward+backward on every chunk of each plan the planner weighs (``K`` = 2 for graph parallelism, 4, 8 and 16 for
GNNPipe on 2 processes), on one thread (one rank's share of this 2-core machine), one warm-up and one timed run each,
and appends the table to ``chunk_seconds.jsonl``; the page is then written from that file without measuring. A table
is measured once per graph, model and ``K``: delete its line to measure it again (on another machine, or after the
model or the package changed).
"""

from __future__ import annotations

import datetime
import functools
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List

import torch

from benchmarks.harness.records import append_cache, git_info, host_info, load_cache
from benchmarks.time_to_accuracy.graph import GraphSpec, community_graph
from benchmarks.time_to_accuracy.rates import derived_rates, median

CHUNK_SECONDS = Path(__file__).resolve().parent / "chunk_seconds.jsonl"
FREE_LINK_BYTES_PER_S = 2.7e9  # gloo over this machine's loopback (docs/results/performance.md, median)
MODELS = ("ressage8", "gcnii16")
CHUNKS_PER_STAGE = (2, 4, 8)
"""GNNPipe's candidates on 2 processes: K = 4, 8, 16 (graph parallelism's plan has K = 2)."""


def _key(graph: GraphSpec, model: str, num_chunks: int) -> tuple:
    return tuple(sorted(asdict(graph).items())), model, num_chunks


def planner_predictions(records: List[dict], graph: GraphSpec, measure: bool = False) -> Dict[tuple, dict]:
    """The planner's training-step estimates (GNNPipe with its best K, graph parallelism; 2 processes) and choice for
    ``graph`` at every rate of the records' derivation (and the free link), keyed ``(model, rate_bits)``.

    It gets the rate as its bandwidth, ``shared_link=True`` (both ranks and both directions pass the one loopback,
    shaped or not) and the chunk times of :data:`CHUNK_SECONDS`; a model whose times are not all there gets no
    prediction unless ``measure`` (then they are measured and appended, about one epoch of one core per plan).
    """
    from benchmarks.time_to_accuracy.models import build_model
    from lightning_gnnpipe import build_chunk_plan, find_layer_stack
    from lightning_gnnpipe.nn.stack import infer_dims
    from lightning_gnnpipe.planner.cost import estimate_layouts, measure_chunk_seconds

    cached = {_key(GraphSpec(**r["graph"]), r["model"], r["num_chunks"]): r["seconds"]
              for r in load_cache(CHUNK_SECONDS)}
    needed = [2] + [k * 2 for k in CHUNKS_PER_STAGE]
    if not measure and not any(_key(graph, m, k) in cached for m in MODELS for k in needed):
        return {}
    data = community_graph(graph)
    plan_of = functools.lru_cache(maxsize=None)(lambda k: build_chunk_plan(data.edge_index, data.num_nodes, k))
    rates = [None] + [r["rate_bits"] for r in derived_rates(records).values()]
    out = {}
    for name in MODELS:
        if not measure and not all(_key(graph, name, k) in cached for k in needed):
            continue
        model = build_model(name, data.num_features, int(data.y.max()) + 1, 0)
        blocks = find_layer_stack(model).blocks
        dims = infer_dims(blocks, data.x[:2])
        params = [p for p in model.parameters() if p.requires_grad]
        measured = measure_chunk_seconds(blocks, data.x, data.edge_index)

        def chunk_seconds(plan, name=name, measured=measured):
            key = _key(graph, name, plan.num_chunks)
            if key not in cached:
                threads = torch.get_num_threads()
                torch.set_num_threads(1)  # one rank's share of the machine
                try:
                    cached[key] = measured(plan)
                finally:
                    torch.set_num_threads(threads)
                append_cache(CHUNK_SECONDS, {"graph": asdict(graph), "model": name, "num_chunks": plan.num_chunks,
                                             "threads": 1, "seconds": cached[key], "git": git_info(),
                                             "host": host_info(), "time": datetime.datetime.now().isoformat()})
            return cached[key]

        calibration = [median([e["train_s"] for e in r["epochs"][1:]]) for r in records
                       if r["status"] == "ok" and r["spec"]["mode"] == "exact" and r["spec"].get("threads") == 1
                       and r["spec"]["model"] == name and GraphSpec(**r["spec"]["graph"]) == graph
                       and len(r["epochs"]) > 1]
        if calibration:  # the whole graph's 1-core seconds per layer, scaled by a chunk's rows, on the free link
            per_layer = [calibration[-1] / len(blocks)] * len(blocks)
            scaled = estimate_layouts(data.edge_index, data.num_nodes, dims, per_layer, 2, FREE_LINK_BYTES_PER_S,
                                      chunks_per_stage=CHUNKS_PER_STAGE,
                                      num_params=sum(p.numel() for p in params), num_param_tensors=len(params),
                                      plan_fn=lambda ei, n, k: plan_of(k), shared_link=True)
            out[(name, "scaled")] = {"gnnpipe": min(e.seconds for e in scaled if e.mode == "gnnpipe"),
                                     "graph_parallel": next(e.seconds for e in scaled if e.mode == "graph_parallel"),
                                     "choice": scaled[0].mode}
        for rate in rates:
            bandwidth = FREE_LINK_BYTES_PER_S if rate is None else rate / 8
            est = estimate_layouts(data.edge_index, data.num_nodes, dims, None, 2, bandwidth,
                                   chunks_per_stage=CHUNKS_PER_STAGE, num_params=sum(p.numel() for p in params),
                                   num_param_tensors=len(params), plan_fn=lambda ei, n, k: plan_of(k),
                                   shared_link=True, chunk_seconds=chunk_seconds)
            pipe = min((e for e in est if e.mode == "gnnpipe"), key=lambda e: e.seconds)
            gp = next(e for e in est if e.mode == "graph_parallel")
            out[(name, rate)] = {"gnnpipe": pipe.seconds, "graph_parallel": gp.seconds, "chunks": pipe.chunks,
                                 "choice": est[0].mode}
        del model
    return out



def chunk_totals(graph: GraphSpec, model: str) -> Dict[int, float]:
    """Seconds of all layers over all chunks of each measured plan (``K`` -> seconds), from :data:`CHUNK_SECONDS`."""
    return {r["num_chunks"]: sum(map(sum, r["seconds"])) for r in load_cache(CHUNK_SECONDS)
            if _key(GraphSpec(**r["graph"]), r["model"], r["num_chunks"]) == _key(graph, model, r["num_chunks"])}
