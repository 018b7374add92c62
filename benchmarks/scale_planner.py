"""The package planner's choice for one scale rung (``benchmarks/scale.py``), where the planner can be imported.

The planner (``estimate_layouts`` / ``recommend``) has lived in ``lightning_gnnpipe.comm.planner`` and is moving to
``lightning_gnnpipe.planner``; :func:`planner_module` tries both and the benchmark writes "planner: n/a" when neither
imports. Inputs, all measured by the benchmark itself: per-layer seconds = the ``trainer_single`` epoch time of the
same rung split evenly over the layers (the same ``model(x, edge_index)`` kernels the ranks run), and the median
rank-0/rank-1 bandwidth measured at the start of the rung's 2-process runs.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Callable, Optional

CANDIDATES = ("lightning_gnnpipe.planner.cost", "lightning_gnnpipe.comm.planner", "lightning_gnnpipe.planner")


def planner_module() -> Optional[ModuleType]:
    """The first importable planner module offering ``estimate_layouts`` and ``recommend``, else ``None``."""
    for name in CANDIDATES:
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a half-moved package may raise anything
            continue
        if hasattr(module, "estimate_layouts") and hasattr(module, "recommend"):
            if not hasattr(module, "measure_bandwidth"):  # moved apart from the cost model
                for other in CANDIDATES:
                    try:
                        module.measure_bandwidth = importlib.import_module(other).measure_bandwidth
                        break
                    except Exception:  # noqa: BLE001
                        continue
            return module
    return None


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
        ``{"planner": {...}}`` with ``choice`` (a mode name), ``estimates`` (seconds, bytes) and ``module``, or
        ``{"planner": {"choice": "n/a", "reason": ...}}`` when the planner cannot be imported or fails.
    """
    module = planner_module()
    if module is None:
        return {"planner": {"choice": "n/a", "reason": f"none of {', '.join(CANDIDATES)} imports"}}
    from scale_worker import build_model

    data = graph_fn(spec)
    gnn = build_model(spec)
    dims = [spec["features"]] + [spec["hidden"]] * (spec["layers"] - 1) + [spec["classes"]]
    inputs = spec["planner"]
    try:
        est = module.estimate_layouts(data.edge_index, data.num_nodes, dims, inputs["layer_seconds"], 2,
                                      inputs["bandwidth"], chunks_per_stage=(4, 8),
                                      num_params=sum(p.numel() for p in gnn.parameters()),
                                      num_param_tensors=len(list(gnn.parameters())))
        choice = module.recommend(est)
    except Exception as exc:  # noqa: BLE001 - an API change mid-refactor must not stop the ladder
        return {"planner": {"choice": "n/a", "reason": f"{type(exc).__name__}: {exc}"[:300]}}
    rows = [{"mode": mode_name({"mode": e.mode, "chunks": e.chunks}), "seconds": e.seconds,
             "compute_s": e.compute_seconds, "comm_s": e.comm_seconds, "bytes": e.bytes_per_epoch} for e in est]
    return {"planner": {"choice": mode_name(choice), "estimates": rows, "module": module.__name__, **inputs}}
