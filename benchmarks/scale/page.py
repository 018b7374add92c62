"""Page and plot of ``benchmarks/scale/run.py`` (its tables in ``tables.py``, its figures in ``ratios.py``), from
the cached run records alone (nothing is measured here).

Peak memory of a process is its peak RSS: the larger of the sampled RSS (every 0.2 s) and the kernel's ``VmHWM``;
RSS counts every resident page, shared ones in full, so the ratios are conservative. USS and PSS are in the detail
tables. Machine memory is the peak of ``psutil.virtual_memory().used`` during the run minus its value just before
(the machine is shared, so other jobs move it too).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from benchmarks.harness.memory import GIB, gib
from benchmarks.scale.ratios import MODES, TARGETS, Rung, largest_proc_rss, ok, rung
from benchmarks.scale.tables import (answer, default_table, detail_rows, memory_split, summary_table, targets_table,
                                     time_split)

__all__ = ["render", "plot", "short", "median_bandwidth",
           # moved to ratios.py; imported from here by run.py
           "MODES", "gib", "largest_proc_rss"]


def setup_section(records: List[dict], meta: dict) -> List[str]:
    """Machine(s), versions, commits and the commands that produced the cache."""
    hosts = sorted({f"{r['host']['hostname']}: {r['host']['cpu']}, {r['host']['cores']} cores, "
                    f"{gib(r['host']['memory'])} GiB RAM" for r in records if r.get("host")})
    vers = sorted({", ".join(f"{k} {v}" for k, v in r["versions"].items()) for r in records if r.get("versions")})
    commits = sorted({f"{r['git']['commit']}{' (dirty tree)' if r['git'].get('dirty') else ''}"
                      for r in records if r.get("git")})
    commands = sorted({"python -m benchmarks.scale.run " + " ".join(portable(r["argv"])) for r in records if "argv" in r})
    loads = [r["host"][k] for r in records for k in ("load_before", "load_after") if r.get("host", {}).get(k) is not None]
    return ["## Setup", "",
            "Reproduce (measures only the rungs missing from the cache, then rewrites this page):", "",
            "```bash", meta["reproduce"], "python -m benchmarks.scale.run --page-only   # the page from the cache alone",
            "```", "", "Commands that produced the cached rows:", "", "```bash", *commands, "```", "",
            f"Machine: {'; '.join(hosts) or '–'}. Load average (1 min) before / after the runs: "
            f"{min(loads):.1f}–{max(loads):.1f}." if loads else f"Machine: {'; '.join(hosts) or '–'}.",
            f"Software: {'; '.join(vers) or '–'}. Package commit(s): {', '.join(commits) or '–'}.", "",
            meta["description"], ""]


def portable(argv: List[str]) -> List[str]:
    """A run's arguments without where its cache and page went (``--cache``, ``--out``) and without ``--force``."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--cache", "--out"):
            skip = True
        elif a != "--force":
            out.append(a)
    return out


def short(n: int) -> str:
    """``250k``, ``2M``: a node count for an axis."""
    return f"{n / 1e6:g}M" if n >= 10**6 else f"{n / 1e3:g}k"


def plot(runs: Dict[Rung, dict], models: List[str], layers_list: List[int], png: Path) -> None:
    """Epoch seconds and largest-process peak RSS against nodes, one column per (model, layers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = [(m, L) for m in models for L in layers_list]
    fig, axes = plt.subplots(2, len(cols), figsize=(4 * len(cols), 7), squeeze=False)
    for c, (model, L) in enumerate(cols):
        drawn = False
        for mode in MODES:
            pts = sorted((k[0], r) for k, r in runs.items() if k[1:] == (model, L, mode) and ok(r))
            if pts:
                drawn = True
                xs = [n for n, _ in pts]
                axes[0][c].plot(xs, [r["epoch_s"] for _, r in pts], "-o", label=mode)
                axes[1][c].plot(xs, [largest_proc_rss(r) / GIB for _, r in pts], "-o", label=mode)
        axes[0][c].set(title=f"{model.upper()}, {L} layers", xscale="log", yscale="log", ylabel="epoch s (median)")
        axes[1][c].set(xscale="log", xlabel="nodes", ylabel="peak RSS GiB (largest process)", ylim=(0, None))
        ticks = sorted({k[0] for k in runs}) or [1]
        for ax in (axes[0][c], axes[1][c]):
            ax.set_xticks(ticks, [short(n) for n in ticks], minor=False)
            ax.set_xticks([], minor=True)
            ax.set_xlim(ticks[0] / 1.5, ticks[-1] * 1.5)
            if not drawn:
                ax.text(0.5, 0.5, "not measured yet", ha="center", va="center", transform=ax.transAxes)
        if drawn:
            axes[0][c].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def render(records: List[dict], ladder: Dict[Rung, str], meta: dict) -> Tuple[str, Dict[Rung, dict]]:
    """The page's markdown and the latest record per rung.

    Args:
        records: Cached records of one setup (graph and hidden width), oldest first.
        ladder: Rungs to show even when not measured, with why they are not.
        meta: ``title``, ``reproduce`` (command), ``description`` (setup paragraph), ``png`` (file name or ``None``).
    """
    runs: Dict[Rung, dict] = {}
    for rec in records:
        runs[rung(rec)] = rec
    keys = list(runs) + list(ladder)
    models = sorted({k[1] for k in keys}, key=lambda m: (m != "gcn", m))
    nodes_list = sorted({k[0] for k in keys})
    layers_list = sorted({k[2] for k in keys})
    out = [f"# {meta['title']}", ""]
    for model in models:
        rows = default_table(runs, model)
        if len(rows) > 2:
            out += [f"**The default, `GNNPipeStrategy()`** (1F1B with an ordinary `training_step`, K = 8, 2 processes) "
                    f"against the best single process (a CSR adjacency), {model.upper()}, hidden 64; ✓ / ✗ against "
                    "its targets. Peak RSS counts shared pages in every process that maps them; PSS splits them; "
                    "USS is what the process alone holds. The launcher is the process that builds the "
                    "DataModule (METIS) and starts the ranks.", "", *rows, ""]
    out += [answer(runs, models, nodes_list, layers_list), "",
           "Targets, per model: time ratios of the fastest GNNPipe run and memory ratios of the leanest (S = 2; "
           "GPipe with K = 8 or 16, 1F1B with K = 8, either with recomputation, `_ckpt`, or 1F1B with bfloat16 history "
           "tables, `_bf16h`) to the baselines; ✓ / ✗ against "
           "the target, – where a side is not measured or failed. The planner column is the package planner's "
           "recommendation for 2 processes beside the measured fastest 2-process mode.", ""]
    legend = "; ".join(f"**{d}**: {meaning}" for _, d, _, _, meaning in TARGETS)
    out += [legend + ".", ""]
    measured = {(k[1], k[0]) for k in runs}
    for model in models:
        if any(m == model for m, _ in measured):
            out += [f"### {model.upper()}: targets", "", *targets_table(runs, model, nodes_list, layers_list), ""]
    for model in models:
        for nodes in nodes_list:
            if (model, nodes) in measured:
                out += [f"### {model.upper()}, {nodes:,} nodes", "",
                        *summary_table(runs, ladder, nodes, model, layers_list), ""]
    missing = [f"{m.upper()} {n:,}" for m in models for n in nodes_list if (m, n) not in measured]
    if missing:
        out += [f"Not measured yet (no mode run): {', '.join(missing)} nodes; see the detail tables.", ""]
    out += time_split(runs)
    out += memory_split(runs)
    out += setup_section(records, meta)
    out += ["## Detail", ""]
    for model in models:
        out += [f"### {model.upper()}: every mode", "", *detail_rows(runs, ladder, model), ""]
    failed = [r for r in runs.values() if not ok(r) and r.get("error_tail")]
    if failed:
        out += ["### Failures (last lines of the log)", ""]
        for r in failed:
            tail = "\n".join(r["error_tail"].splitlines()[-8:])
            out += [f"{r['model']} L={r['layers']} {r['nodes']:,} nodes {r['mode']}: {r['status']}", "", "```",
                    tail, "```", ""]
    if meta.get("png"):
        out += ["## Plot", "", f"![epoch time and peak memory against nodes]({meta['png']})", ""]
    return "\n".join(out), runs


def median_bandwidth(records: List[dict]) -> Optional[float]:
    """Median rank-0/rank-1 bandwidth measured at the start of the 2-process runs (bytes/s), or ``None``."""
    found = [r["bandwidth_Bps"] for r in records if ok(r) and r.get("bandwidth_Bps")]
    return statistics.median(found) if found else None
