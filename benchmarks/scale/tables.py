"""The scale page's tables and paragraphs, one function each, from the latest record per rung (``page.py`` puts
them together; nothing is measured here).
"""

from __future__ import annotations

from typing import Dict, List, Optional

from benchmarks.harness.memory import gib
from benchmarks.scale.ratios import (GNNPIPE, MODES, TARGETS, Rung, best_gnnpipe, fmt_ratio, judge,
                                     largest_proc_rss, leanest_gnnpipe, machine_delta, ok, proc_rss, ratio,
                                     target_values)


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
