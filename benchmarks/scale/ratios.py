"""The scale records' figures: rungs, each process's peak memory, and the target ratios of a rung with their
verdicts (``benchmarks/scale/page.py`` and ``tables.py`` build ``docs/results/scale.md`` from them, and the targets'
table of ``docs/results/notes/scale.md``; nothing is measured here).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from benchmarks.harness import page


MODES = ["pyg_edge_index", "pyg_csr", "trainer_single", "gnnpipe_default", "gnnpipe_k8", "gnnpipe_k16", "gnnpipe_1f1b_k8",
         "gnnpipe_ckpt_k8", "gnnpipe_1f1b_ckpt_k8", "gnnpipe_1f1b_bf16h_k8", "graph_parallel"]
GNNPIPE = ("gnnpipe_default", "gnnpipe_k8", "gnnpipe_k16", "gnnpipe_1f1b_k8", "gnnpipe_ckpt_k8", "gnnpipe_1f1b_ckpt_k8",
           "gnnpipe_1f1b_bf16h_k8")
Rung = Tuple[int, str, int, str]  # nodes, model, layers, mode
TARGETS = [  # (column, short header, limit, "<=" or ">=", meaning)
    ("time_csr", "GNNPipe ÷ CSR time", 1.0, "<=", "epoch time of GNNPipe over the CSR single-process baseline"),
    ("time_edge", "GNNPipe ÷ edge_index time", 0.3, "<=", "epoch time of GNNPipe over the plain `model(x, edge_index)` loop"),
    ("time_gp", "GP ÷ GNNPipe time", 1.58, ">=", "epoch time of graph parallelism over GNNPipe (target at 16 layers only)"),
    ("mem_rank", "rank ÷ CSR peak RSS", 0.6, "<=", "peak RSS of the largest GNNPipe rank over the CSR baseline's"),
    ("mem_rank_pss", "rank ÷ CSR peak PSS", 0.6, "<=", "the same with PSS (the shared graph's pages split between "
     "the processes that map them)"),
    ("mem_machine", "machine ÷ CSR machine peak", 1.2, "<=", "machine peak used memory (delta) of GNNPipe over the CSR baseline's"),
]


def rung(rec: dict) -> Rung:
    """The ladder position of a record (epochs are not part of it: the latest record wins)."""
    return rec["nodes"], rec["model"], rec["layers"], rec["mode"]


def ok(rec: Optional[dict]) -> bool:
    """Whether a record exists and its run finished (status ``ok``)."""
    return rec is not None and rec.get("status") == "ok"


def proc_rss(peaks: dict) -> int:
    """Peak RSS of one process (bytes): the sampled peak or the kernel's high-water mark, whichever is larger."""
    return max(peaks.get("rss", 0), peaks.get("vm_hwm") or 0)


def largest_proc_rss(rec: dict, measure=proc_rss) -> Optional[int]:
    """Peak RSS (or ``measure``) of the largest rank of a 2-process run, or of the one process of a single-process
    run (bytes)."""
    procs = rec.get("processes") or {}
    ranks = [measure(p) for role, p in procs.items() if role.startswith("rank")]
    if ranks:
        return max(ranks)
    return measure(procs["main"]) if "main" in procs else None


def proc_pss(peaks: dict) -> Optional[int]:
    """Sampled peak PSS of one process (bytes): shared pages split between the processes that map them."""
    return peaks.get("pss")


def machine_delta(rec: dict) -> Optional[int]:
    """The machine's peak used memory during a run above its use just before (bytes; every process counts)."""
    return (rec.get("machine") or {}).get("used_delta")


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """``a / b``, or ``None`` where either side is missing (or ``b`` is 0)."""
    return a / b if a is not None and b else None


def fmt_ratio(r: Optional[float]) -> str:
    """``0.55x`` as every results page writes a ratio, ``–`` where it is not measured."""
    return "–" if r is None else page.fmt_ratio(r)


def best_gnnpipe(runs: Dict[Rung, dict], nodes: int, model: str, layers: int) -> Optional[dict]:
    """The fastest of the measured GNNPipe runs of a rung (the default, GPipe K = 8, 16, 1F1B K = 8 and their
    variants)."""
    found = [runs[(nodes, model, layers, m)] for m in GNNPIPE if ok(runs.get((nodes, model, layers, m)))]
    return min(found, key=lambda r: r["epoch_s"]) if found else None


def leanest_gnnpipe(runs: Dict[Rung, dict], nodes: int, model: str, layers: int) -> Optional[dict]:
    """The measured GNNPipe run of a rung whose largest rank peaked lowest (RSS)."""
    found = [runs[(nodes, model, layers, m)] for m in GNNPIPE if ok(runs.get((nodes, model, layers, m)))]
    return min(found, key=lambda r: largest_proc_rss(r) or 0) if found else None


def target_values(runs: Dict[Rung, dict], nodes: int, model: str, layers: int) -> Dict[str, Optional[float]]:
    """The target ratios of one (nodes, model, layers), ``None`` where a side is missing or failed: times of
    the fastest GNNPipe run, memory of the leanest."""
    pipe, lean = best_gnnpipe(runs, nodes, model, layers), leanest_gnnpipe(runs, nodes, model, layers)
    get = {m: runs.get((nodes, model, layers, m)) for m in MODES}
    csr, edge, gp = (get[m] if ok(get[m]) else None for m in ("pyg_csr", "pyg_edge_index", "graph_parallel"))
    if pipe is None:
        return dict.fromkeys([t[0] for t in TARGETS])
    return {"time_csr": ratio(pipe["epoch_s"], csr and csr["epoch_s"]),
            "time_edge": ratio(pipe["epoch_s"], edge and edge["epoch_s"]),
            "time_gp": ratio(gp and gp["epoch_s"], pipe["epoch_s"]),
            "mem_rank": ratio(largest_proc_rss(lean), csr and largest_proc_rss(csr)),
            "mem_rank_pss": ratio(largest_proc_rss(lean, proc_pss), csr and largest_proc_rss(csr, proc_pss)),
            "mem_machine": ratio(machine_delta(lean), csr and machine_delta(csr))}


def judge(column: str, value: Optional[float], layers: int) -> Optional[bool]:
    """Whether a ratio meets its target; ``None`` where it has no target (graph parallelism below 16 layers)."""
    if value is None or (column == "time_gp" and layers < 16):
        return None
    limit, op = next((t[2], t[3]) for t in TARGETS if t[0] == column)
    return value <= limit if op == "<=" else value >= limit


def targets_table(runs: Dict[Rung, dict], model: str) -> List[str]:
    """One row per measured (nodes, layers) of a model: the fastest and the leanest GNNPipe run and the target ratios,
    ✓ / ✗ against the targets (– where a side is not measured)."""
    head = [f"{d} ({'≤' if op == '<=' else '≥'} {lim})" for _, d, lim, op, _ in TARGETS]
    rows = []
    for nodes, layers in sorted({(k[0], k[2]) for k in runs if k[1] == model}):
        pipe, lean = best_gnnpipe(runs, nodes, model, layers), leanest_gnnpipe(runs, nodes, model, layers)
        if pipe is None:
            continue
        values = target_values(runs, nodes, model, layers)
        cells = []
        for col, *_ in TARGETS:
            verdict = judge(col, values[col], layers)
            cells.append(fmt_ratio(values[col]) + ("" if verdict is None else (" ✓" if verdict else " ✗")))
        rows.append([f"{nodes:,}", str(layers), pipe["mode"], *cells, lean["mode"]])
    return page.markdown_table(["nodes", "L", "fastest GNNPipe", *head, "leanest GNNPipe"], rows)
