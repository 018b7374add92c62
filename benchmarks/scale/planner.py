"""The package planner's choice for one scale rung (``python -m benchmarks.scale.run``).

Inputs, all measured by the benchmark itself: per-layer seconds = the ``trainer_single`` epoch time of the same rung
split evenly over the layers (the same ``model(x, edge_index)`` kernels the ranks run), and the median
rank-0/rank-1 bandwidth measured at the start of the rung's 2-process runs.
"""

from __future__ import annotations

from typing import Callable

from benchmarks.scale.graph import build_model
from lightning_gnnpipe.planner import cost


def mode_name(choice: dict) -> str:
    """The benchmark mode of a ``recommend`` answer (``gnnpipe_k8``, ``graph_parallel``, ...)."""
    if choice["mode"] == "gnnpipe":
        return f"gnnpipe_k{choice['chunks']}"
    return choice["mode"]


def planner_estimates(spec: dict, graph_fn: Callable) -> dict:
    """Estimates for GNNPipe (``S = 2``, ``K = 8, 16``) and graph parallelism (``G = 2``) on 2 processes.

    Args:
        spec: A worker spec with ``spec["planner"] = {"layer_seconds": [...], "bandwidth": bytes/s}``.
        graph_fn: Builds the spec's graph.

    Returns:
        ``{"planner": {...}}`` with ``choice`` (a mode name) and ``estimates`` (seconds, bytes), or
        ``{"planner": {"choice": "n/a", "reason": ...}}`` when the planner fails.
    """
    data = graph_fn(spec)
    gnn = build_model(spec)
    dims = [spec["features"]] + [spec["hidden"]] * (spec["layers"] - 1) + [spec["classes"]]
    inputs = spec["planner"]
    try:
        est = cost.estimate_layouts(data.edge_index, data.num_nodes, dims, inputs["layer_seconds"], 2,
                                    inputs["bandwidth"], chunks_per_stage=(4, 8),
                                    num_params=sum(p.numel() for p in gnn.parameters()),
                                    num_param_tensors=len(list(gnn.parameters())))
        choice = cost.recommend(est)
    except Exception as exc:  # noqa: BLE001 - the estimate of one rung must not stop the ladder
        return {"planner": {"choice": "n/a", "reason": f"{type(exc).__name__}: {exc}"[:300]}}
    rows = [{"mode": mode_name({"mode": e.mode, "chunks": e.chunks}), "seconds": e.seconds,
             "compute_s": e.compute_seconds, "comm_s": e.comm_seconds, "bytes": e.bytes_per_epoch} for e in est]
    return {"planner": {"choice": mode_name(choice), "estimates": rows, **inputs}}
