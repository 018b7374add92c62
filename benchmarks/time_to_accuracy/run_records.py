"""What the time-to-accuracy page reads from a cached run: the modes and their labels, the keys that name a run's
model and mode, and a run's seconds, best epoch, epochs to a target and peak memory."""

from __future__ import annotations

import statistics
from typing import Dict, List, Optional, Tuple

MODES = ("exact", "gnnpipe", "gnnpipe_refresh_every0", "gnnpipe_halo_gradients", "gnnpipe_refresh_every1", "gnnpipe_refresh_every2",
         "graph_parallel", "hybrid", "mlp")
LABEL = {"exact": "exact, one process, CSR adjacency (2 threads)", "gnnpipe": "`GNNPipeStrategy()`, K = 8 (2 processes)",
         "gnnpipe_refresh_every0": "`GNNPipeStrategy(refresh_every=0)`, K = 8 (2 processes)",
         "gnnpipe_halo_gradients": "`GNNPipeStrategy(halo_gradients=\"stale\")`, K = 8 (2 processes)",
         "gnnpipe_refresh_every1": "`GNNPipeStrategy(refresh_every=1)`, K = 8 (2 processes)",
         "gnnpipe_refresh_every2": "`GNNPipeStrategy(refresh_every=2)`, K = 8 (2 processes)",
         "graph_parallel": "`GraphParallelStrategy()` (2 processes)",
         "hybrid": "hybrid 2 stages x 2 partitions, K = 8 (4 processes)", "mlp": "MLP, one process (no graph)"}
EXACT_FORWARD = {"refresh_every": 1, "halo_gradients": "fresh"}
"""GNNPipe's option for deep models: exact halo rows in the training forward, every cut edge's gradient every second
epoch (docs/convergence.md); the targets name it beside the defaults."""
LABEL["gnnpipe_halo_gradientsfresh_refresh_every1"] = ("`GNNPipeStrategy(refresh_every=1, halo_gradients=\"fresh\")` "
                                                       "(the defaults in these fits), K = 8 (2 processes)")
GRAPHS = {"page": "page's graph", "spread": "spread graph"}  # the spread graph: long-range edges on every node
SHORT = {"gnnpipe": "GNNPipe", "graph_parallel": "graph parallel", "hybrid": "hybrid 2x2"}


def ok(rec: Optional[dict]) -> bool:
    """Whether ``rec`` is a record of a run that finished (status ``ok``)."""
    return rec is not None and rec.get("status") == "ok"


def timed(rec: dict, key: str) -> Optional[float]:
    """The median of ``key`` (``train_s``, ``val_s``, ``sent_bytes``) over the run's epochs after the first (all of
    them when it has one); ``None`` when no epoch has it."""
    vals = [e[key] for e in rec["epochs"][1:] if e.get(key) is not None] or [e[key] for e in rec["epochs"]
                                                                            if e.get(key) is not None]
    return statistics.median(vals) if vals else None


def best_epoch(rec: dict) -> Tuple[int, float, float]:
    """``(epoch index, val acc, test acc)`` of the best validation accuracy (first on ties)."""
    rows = rec["epochs"]
    i = max(range(len(rows)), key=lambda e: (rows[e].get("val_acc", -1), -e))
    return i, rows[i]["val_acc"], rows[i]["test_acc"]


def to_target(rec: dict, target: float) -> Tuple[Optional[int], Optional[float]]:
    """Epochs (from 1) and training + validation seconds until validation accuracy first reaches ``target``."""
    seconds = 0.0
    for e, row in enumerate(rec["epochs"]):
        seconds += row["train_s"] + row["val_s"]
        if row.get("val_acc", -1) >= target:
            return e + 1, seconds
    return None, None


def largest(rec: dict, kind: str) -> Optional[int]:
    """The peak ``kind`` (``rss``, ``uss``) of the run's largest rank (or of its one process), bytes."""
    procs = rec.get("processes") or {}
    ranks = [p for role, p in procs.items() if role.startswith("rank")] or [procs.get("main", {})]
    vals = [max(p.get(kind, 0), p.get("vm_hwm", 0)) if kind == "rss" else p.get(kind, 0) for p in ranks]
    return max(vals) if vals else None


def index(records: List[dict]) -> Dict[tuple, dict]:
    """Records by ``(nodes, model, mode, seed, chunks, epochs, validate, threads, rate)``."""
    out = {}
    for rec in records:
        s = rec["spec"]
        out[(s["graph"]["num_nodes"], s["model"], s["mode"], s["seed"], s["chunks"], s["epochs"], s["validate"],
             s.get("threads"), s["rate_bits"])] = rec
    return out


def model_key(s: dict) -> str:
    """The model of a spec, with its learning rate and schedule when the spec sets them (``gcnii16 (lr 0.005)``,
    ``gcnii16 (cosine)``)."""
    extra = ([f"lr {s['lr']}"] if "lr" in s else []) + ([s["lr_schedule"]] if s.get("lr_schedule") else [])
    return s["model"] + (f" ({', '.join(extra)})" if extra else "")


def mode_key(s: dict) -> str:
    """The mode of a spec with its strategy options and a K other than 8 (``gnnpipe_refresh_every1``,
    ``gnnpipe_k2``); its label goes into :data:`LABEL` if it has none."""
    opts = sorted(s.get("strategy", {}).items())
    key = "_".join([s["mode"], *(k if (k, v) == ("halo_gradients", "stale") else f"{k}{v}" for k, v in opts)]
                   + ([f"k{s['chunks']}"] if s["mode"] == "gnnpipe" and s["chunks"] != 8 else []))
    if key not in LABEL:
        args = ", ".join(f"{k}={v!r}" for k, v in opts)
        LABEL[key] = f"`GNNPipeStrategy({args})`, K = {s['chunks']} (2 processes)"
    return key

def default_modes() -> Tuple[str, str]:
    """The mode keys of ``GNNPipeStrategy()``'s runs: its own, and :data:`EXACT_FORWARD`'s (what the defaults resolve
    to in these fits)."""
    return "gnnpipe", mode_key({"mode": "gnnpipe", "chunks": 8, "strategy": EXACT_FORWARD})


def mode_order(mode: str) -> Tuple[int, str]:
    """Table order: :data:`MODES`, a tuned GNNPipe run after GNNPipe's defaults."""
    return (MODES.index(mode), "") if mode in MODES else (MODES.index("gnnpipe"), mode)

