"""Tables, page and plot of ``benchmarks/scale/run.py``, from the cached run records alone (nothing is measured here).

Peak memory of a process is its peak RSS: the larger of the sampled RSS (every 0.2 s) and the kernel's ``VmHWM``;
RSS counts every resident page, shared ones in full, so the ratios are conservative. USS and PSS are in the detail
tables. Machine memory is the peak of ``psutil.virtual_memory().used`` during the run minus its value just before
(the machine is shared, so other jobs move it too).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Dict, List, Optional, Tuple

GIB = 2**30
MODES = ["pyg_edge_index", "pyg_csr", "trainer_single", "gnnpipe_default", "gnnpipe_k8", "gnnpipe_k16", "gnnpipe_1f1b_k8",
         "gnnpipe_ckpt_k8", "gnnpipe_1f1b_ckpt_k8", "gnnpipe_1f1b_bf16h_k8", "graph_parallel"]
GNNPIPE = ("gnnpipe_k8", "gnnpipe_k16", "gnnpipe_1f1b_k8", "gnnpipe_ckpt_k8", "gnnpipe_1f1b_ckpt_k8",
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
    return (rec.get("machine") or {}).get("used_delta")


def gib(b: Optional[float]) -> str:
    return "–" if b is None else f"{b / GIB:.2f}"


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def fmt_ratio(r: Optional[float]) -> str:
    return "–" if r is None else f"{r:.2f}×"


def best_gnnpipe(runs: Dict[Rung, dict], nodes: int, model: str, layers: int) -> Optional[dict]:
    """The fastest of the measured GNNPipe runs of a rung (GPipe K = 8, 16; 1F1B K = 8)."""
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


def planner_cell(runs: Dict[Rung, dict], nodes: int, model: str, layers: int) -> str:
    """``planner: <choice>`` with the measured fastest 2-process mode, or why there is none."""
    rec = runs.get((nodes, model, layers, "planner"))
    if rec is None:
        return "planner: not run"
    plan = rec.get("planner") or {}
    if not ok(rec) or plan.get("choice", "n/a") == "n/a":
        return "planner: n/a"
    two = [runs[(nodes, model, layers, m)] for m in (*GNNPIPE, "graph_parallel")
           if ok(runs.get((nodes, model, layers, m)))]
    best = min(two, key=lambda r: r["epoch_s"])["mode"] if two else "–"
    src = f"{plan.get('seconds_from', '?')} s/layer, {plan.get('bandwidth_from', '?')} bandwidth"
    return f"planner: {plan['choice']} (measured fastest: {best}; inputs: {src})"


def targets_table(runs: Dict[Rung, dict], model: str, nodes_list: List[int], layers_list: List[int]) -> List[str]:
    """One row per (nodes, layers) of a model: the five ratios, ✓ / ✗ against the targets, and the planner."""
    head = " | ".join(f"{d} ({'≤' if op == '<=' else '≥'} {lim})" for _, d, lim, op, _ in TARGETS)
    lines = [f"| nodes | L | fastest GNNPipe | {head} | leanest GNNPipe | planner |", "|---" * (len(TARGETS) + 5) + "|"]
    for nodes in nodes_list:
        for layers in layers_list:
            if not any(k[:3] == (nodes, model, layers) for k in runs):
                continue
            pipe, lean = best_gnnpipe(runs, nodes, model, layers), leanest_gnnpipe(runs, nodes, model, layers)
            values = target_values(runs, nodes, model, layers)
            cells = []
            for col, *_ in TARGETS:
                verdict = judge(col, values[col], layers)
                mark = "" if verdict is None else (" ✓" if verdict else " ✗")
                cells.append(fmt_ratio(values[col]) + mark)
            fast, thin = (r["mode"] if r else "not run" for r in (pipe, lean))
            lines.append(f"| {nodes:,} | {layers} | {fast} | " + " | ".join(cells)
                         + f" | {thin} | {planner_cell(runs, nodes, model, layers)} |")
    return lines


DEFAULT_TARGETS = [  # (column, limit): the default's targets against the CSR single process
    ("epoch", 0.6), ("rss", 0.6), ("machine", 1.2), ("launcher", 0.5)]


def default_values(runs: Dict[Rung, dict], nodes: int, model: str, layers: int) -> Optional[dict]:
    """The default's (``gnnpipe_default``) figures and ratios to the CSR process, or ``None`` if either is missing."""
    pipe, csr = runs.get((nodes, model, layers, "gnnpipe_default")), runs.get((nodes, model, layers, "pyg_csr"))
    if not ok(pipe) or not ok(csr):
        return None
    procs, base = pipe.get("processes") or {}, (csr.get("processes") or {}).get("main", {})
    ranks = [p for role, p in procs.items() if role.startswith("rank")]
    out = {"epoch": (pipe["epoch_s"], csr["epoch_s"]),
           "rss": (max(proc_rss(p) for p in ranks), proc_rss(base)),
           "pss": (max(p.get("pss", 0) for p in ranks), base.get("pss")),
           "uss": (max(p.get("uss", 0) for p in ranks), base.get("uss")),
           "machine": (machine_delta(pipe), machine_delta(csr)),
           "launcher": (proc_rss(procs.get("main", {})), proc_rss(base))}
    return {k: (a, b, ratio(a, b)) for k, (a, b) in out.items()}


def default_table(runs: Dict[Rung, dict], model: str) -> List[str]:
    """One row per measured rung of the default against the CSR single process, ✓ / ✗ against its targets."""
    lines = ["| nodes | L | epoch s (÷CSR, ≤ 0.6) | largest rank peak RSS GiB (÷CSR, ≤ 0.6) | PSS GiB (÷CSR) | "
             "USS GiB (÷CSR) | machine Δ GiB (÷CSR, ≤ 1.2) | launcher peak RSS GiB (÷CSR, ≤ 0.5) | "
             "CSR epoch s | CSR peak RSS GiB |", "|---" * 10 + "|"]
    limits = dict(DEFAULT_TARGETS)
    for nodes, _, layers, _ in sorted(k for k in runs if k[1] == model and k[3] == "gnnpipe_default"):
        v = default_values(runs, nodes, model, layers)
        if v is None:
            continue

        def cell(key: str, seconds: bool = False) -> str:
            a, _, r = v[key]
            mark = "" if key not in limits or r is None else (" ✓" if r <= limits[key] else " ✗")
            return f"{a:.2f} ({fmt_ratio(r)}{mark})" if seconds else f"{gib(a)} ({fmt_ratio(r)}{mark})"

        lines.append(f"| {nodes:,} | {layers} | {cell('epoch', True)} | {cell('rss')} | {cell('pss')} | "
                     f"{cell('uss')} | {cell('machine')} | {cell('launcher')} | {v['epoch'][1]:.2f} | "
                     f"{gib(v['rss'][1])} |")
    failed = [k for k, r in runs.items() if k[1] == model and k[3] == "gnnpipe_default" and not ok(r)]
    lines += [f"| {k[0]:,} | {k[2]} | {runs[k]['status']} |" + " – |" * 7 for k in sorted(failed)]
    return lines


def summary_table(runs: Dict[Rung, dict], ladder: Dict[Rung, str], nodes: int, model: str,
                  layers_list: List[int]) -> List[str]:
    """Rows = modes; per depth: epoch seconds (÷ CSR, ÷ graph parallel) and largest-process peak RSS (÷ CSR)."""
    head = " | ".join(f"L={L} epoch s (÷CSR, ÷GP) | L={L} peak GiB (÷CSR)" for L in layers_list)
    lines = [f"| mode | {head} |", "|---" * (1 + 2 * len(layers_list)) + "|"]
    for mode in MODES:
        cells = []
        for L in layers_list:
            rec, csr, gp = (runs.get((nodes, model, L, m)) for m in (mode, "pyg_csr", "graph_parallel"))
            if not ok(rec):
                why = rec["status"] if rec else ladder.get((nodes, model, L, mode), "not run")
                cells += [why, "–"]
                continue
            t = rec["epoch_s"]
            cells.append(f"{t:.2f} ({fmt_ratio(ratio(t, csr['epoch_s'] if ok(csr) else None))}, "
                         f"{fmt_ratio(ratio(t, gp['epoch_s'] if ok(gp) else None))})")
            m = largest_proc_rss(rec)
            cells.append(f"{gib(m)} ({fmt_ratio(ratio(m, largest_proc_rss(csr) if ok(csr) else None))})")
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    return lines


def per_process(rec: dict, key: str) -> str:
    """``main / rank0 / rank1`` peaks of one kind (GiB)."""
    procs = rec.get("processes") or {}
    order = sorted(procs, key=lambda r: (r != "main", r))
    if key == "rss":
        return " / ".join(gib(proc_rss(procs[r])) for r in order) or "–"
    return " / ".join(gib(procs[r].get(key)) for r in order) or "–"


DETAIL_HEAD = ("| nodes | L | mode | status | epochs timed | epoch s (median) | first epoch s | ÷CSR | MiB sent/epoch | "
               "peak RSS GiB (main / rank0 / rank1) | peak PSS GiB | peak USS GiB | machine Δ GiB | machine peak GiB | "
               "min available GiB | graph s | setup s | wall s | threads | last loss |")


def detail_rows(runs: Dict[Rung, dict], ladder: Dict[Rung, str], model: str) -> List[str]:
    """Every rung of a model, measured or not, with every measured column."""
    lines = [DETAIL_HEAD, "|---" * DETAIL_HEAD.count(" | ") + "|---|"]
    keys = sorted({k for k in list(runs) + list(ladder) if k[1] == model and k[3] in MODES},
                  key=lambda k: (k[0], k[2], MODES.index(k[3])))
    for nodes, _, L, mode in keys:
        rec = runs.get((nodes, model, L, mode))
        if rec is None:
            lines.append(f"| {nodes:,} | {L} | {mode} | {ladder.get((nodes, model, L, mode), 'not run')} |"
                         + " – |" * 16)
            continue
        csr = runs.get((nodes, model, L, "pyg_csr"))
        good = ok(rec)
        machine = rec.get("machine") or {}
        sent = rec.get("bytes_sent_per_epoch")
        loss = (rec.get("losses") or [None])[-1]
        cells = [f"{nodes:,}", str(L), mode, rec["status"], str(rec.get("timed_epochs", "–")),
                 f"{rec['epoch_s']:.3f}" if good else "–",
                 f"{rec['epoch_s_all'][0]:.3f}" if good else "–",
                 fmt_ratio(ratio(rec["epoch_s"], csr["epoch_s"])) if good and ok(csr) else "–",
                 f"{sent / 2**20:,.1f}" if sent is not None else "–",
                 per_process(rec, "rss"), per_process(rec, "pss"), per_process(rec, "uss"),
                 gib(machine.get("used_delta")), gib(machine.get("used_peak")), gib(machine.get("available_min")),
                 f"{rec['graph_s']:.1f}" if "graph_s" in rec else "–",
                 f"{rec['mode_setup_s']:.1f}" if "mode_setup_s" in rec else "–",
                 f"{rec['wall_s']:.0f}", str(rec.get("threads", "–")), f"{loss:.4f}" if loss is not None else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def answer(runs: Dict[Rung, dict], models: List[str], nodes_list: List[int], layers_list: List[int]) -> str:
    """One paragraph: how many target ratios were measured and met, and which rungs they cover."""
    met, total, covered = 0, 0, set()
    for model in models:
        for nodes in nodes_list:
            for L in layers_list:
                values = target_values(runs, nodes, model, L)
                for col, value in values.items():
                    verdict = judge(col, value, L)
                    if verdict is not None:
                        met, total = met + verdict, total + 1
                        covered.add(f"{model} {nodes:,} nodes L={L}")
    if not total:
        return "**Answer.** No target ratio is measured yet: the cache holds no rung with both GNNPipe and a baseline."
    return (f"**Answer.** {met} of {total} measured target ratios are met, on {len(covered)} rung(s): "
            f"{'; '.join(sorted(covered))}. Rungs not listed are not measured yet (see the detail tables).")


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


def time_split(runs: Dict[Rung, dict]) -> List[str]:
    """Where a 2-process epoch goes, per rank, from the strategies' own ``comm/...`` metrics of the last epoch."""
    rows = []
    for key in sorted(runs):
        rec = runs[key]
        comm = rec.get("comm_last_epoch") or {}
        if not ok(rec) or "comm/step_s/rank0" not in comm:
            continue
        per = lambda name: " / ".join(f"{comm.get(f'comm/{name}/rank{r}', 0.0):.1f}" for r in range(2))  # noqa: E731
        rows.append(f"| {rec['model']} | {rec['layers']} | {rec['nodes']:,} | {rec['mode']} | {rec['epoch_s']:.1f} | "
                    f"{per('step_s')} | {per('compute_s')} | {per('bubble_s')} | {per('wait_s')} | "
                    f"{gib(rec.get('bytes_sent_per_epoch'))} | {rec['host'].get('load_before', 0):.1f} | "
                    f"{'yes' if rec.get('huge_pages') else 'no'} |")
    if not rows:
        return []
    return ["## Where the time goes", "",
            "Last measured epoch of each 2-process run, per rank (rank 0 / rank 1), in seconds: the training step, the "
            "stage compute in it, the pipeline fill and drain (bubble) and other waiting on the neighbour (GNNPipe); "
            "graph parallelism has no stages: its wait is the time blocked in halo exchanges and the gradient all-reduce. The epoch also holds the "
            "optimizer step and Lightning's loop. Load: the machine's 1-minute load average before the run (2 cores). "
            "THP: run with torch's transparent huge pages (`THP_MEM_ALLOC_ENABLE=1`, every process of the run). "
            "Before/after measurements of the kernels: [notes/scale_time.md](notes/scale_time.md).", "",
            "| model | L | nodes | mode | epoch s | step s | compute s | bubble s | wait s | GiB sent | load | THP |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, ""]


def memory_split(runs: Dict[Rung, dict]) -> List[str]:
    """Where a 2-process run's memory goes, per rank, from the breakdown the worker records at the last epoch."""
    rows = []
    for key in sorted(runs):
        rec = runs[key]
        for r, b in enumerate(rec.get("breakdown") or [] if ok(rec) else []):
            kept, now, peak, trim = (b.get(k) or {} for k in ("kept_bytes", "now_bytes", "peak_bytes", "trimmed_bytes"))
            cells = [gib(kept.get(k)) for k in ("history", "chunk_graph", "data")]
            cells += [gib(now.get("uss")), gib(trim.get("uss")), gib(peak.get("uss")), gib(peak.get("rss"))]
            rows.append(f"| {rec['model']} | {rec['layers']} | {rec['nodes']:,} | {rec['mode']} | {r} | "
                        + " | ".join(cells) + " |")
    if not rows:
        return []
    return ["## Where the memory goes", "",
            "Per rank at the end of the last epoch (GiB): the history tables and chunk graphs it keeps, the graph the "
            "DataModule holds (shared memory under spawn, counted in RSS, not in USS), its USS then, its USS after "
            "glibc's `malloc_trim(0)` (free heap memory returned), and the peaks of USS and RSS since the rank started. "
            "What the kept tensors do not explain is the interpreter (about 0.35 GiB of USS), the pipeline's "
            "send/receive buffers, and at the peak the activations of the chunks in flight. Discussion and "
            "before/after figures: [notes/memory.md](notes/memory.md).", "",
            "| model | L | nodes | mode | rank | tables | chunk graphs | data (shared) | USS | USS trimmed | "
            "peak USS | peak RSS |", "|---" * 12 + "|", *rows, ""]


def median_bandwidth(records: List[dict]) -> Optional[float]:
    """Median rank-0/rank-1 bandwidth measured at the start of the 2-process runs (bytes/s), or ``None``."""
    found = [r["bandwidth_Bps"] for r in records if ok(r) and r.get("bandwidth_Bps")]
    return statistics.median(found) if found else None
