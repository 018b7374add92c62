"""The scale page's generated blocks, one function each, from the latest record per rung (``page.py`` puts them into
the hand-written page with :func:`benchmarks.harness.page.fill_blocks`; nothing is measured here).

Only measured rungs are rows: a rung without a record is left out, a failed one shows its status.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from benchmarks.harness.memory import gib
from benchmarks.harness.page import markdown_table
from benchmarks.scale.ratios import (MODES, Rung, fmt_ratio, largest_proc_rss, machine_delta, ok, proc_pss, proc_rss,
                                     ratio)

DEFAULT, SINGLE = "gnnpipe_default", "pyg_csr"  # today's default, and the best single process


def short(n: int) -> str:
    """``250k``, ``2M``: a node count for a table cell or an axis."""
    return f"{n / 1e6:g}M" if n >= 10**6 else f"{n / 1e3:g}k"


def proc_uss(peaks: dict) -> Optional[int]:
    """Sampled peak USS of one process (bytes): what it alone holds."""
    return peaks.get("uss")


def answer_rungs(runs: Dict[Rung, dict]) -> List[Rung]:
    """The (nodes, model, layers) rungs, as ``(nodes, model, layers, DEFAULT)``, where both the default and the
    single process ran to the end, smallest graph first."""
    return sorted(k for k, r in runs.items()
                  if k[3] == DEFAULT and ok(r) and ok(runs.get((k[0], k[1], k[2], SINGLE))))


def answer_values(runs: Dict[Rung, dict], key: Rung) -> Dict[str, tuple]:
    """``{what: (default's, single process's)}`` of one rung: epoch seconds, the largest process's peak USS and the
    machine's peak (bytes above its use before the run, all processes)."""
    pipe, one = runs[key], runs[(key[0], key[1], key[2], SINGLE)]
    return {"epoch": (pipe["epoch_s"], one["epoch_s"]),
            "uss": (largest_proc_rss(pipe, proc_uss), largest_proc_rss(one, proc_uss)),
            "machine": (machine_delta(pipe), machine_delta(one))}


def answer_table(runs: Dict[Rung, dict]) -> List[str]:
    """The default on 2 processes against one CSR process: epoch, largest rank's memory, the machine's memory."""

    def cell(a: float, b: float, unit: str, fmt=gib) -> str:
        return f"{fmt(a)} / {fmt(b)} {unit} ({fmt_ratio(ratio(a, b))})"

    rows = []
    for key in answer_rungs(runs):
        v = answer_values(runs, key)
        rows.append([f"{short(key[0])}", f"{key[1].upper()}-{key[2]}",
                     cell(*v["epoch"], "s", lambda s: f"{s:.2f}"), cell(*v["uss"], "GiB"),
                     cell(*v["machine"], "GiB")])
    return markdown_table(["nodes", "model", "epoch: 2 processes / one process", "largest rank's peak USS / one "
                           "process's", "machine's peak: 2 processes / one process"], rows, "llrrr")


def mode_table(runs: Dict[Rung, dict], model: str, layers: int) -> List[str]:
    """Every measured mode of one (model, layers), by graph size: epoch seconds (÷ CSR, ÷ graph parallelism), the
    largest process's peak RSS and USS (÷ CSR) and the machine's peak (÷ CSR)."""
    rows = []
    for nodes in sorted({k[0] for k in runs if k[1:3] == (model, layers)}):
        csr, gp = (runs.get((nodes, model, layers, m)) for m in (SINGLE, "graph_parallel"))
        csr, gp = (r if ok(r) else None for r in (csr, gp))
        for mode in MODES:
            rec = runs.get((nodes, model, layers, mode))
            if rec is None:
                continue
            if not ok(rec):
                rows.append([f"{nodes:,}", mode, rec["status"], "–", "–", "–"])
                continue

            def vs(get, base_rec, value: Optional[float]) -> str:
                base = get(base_rec) if base_rec else None
                return fmt_ratio(ratio(value, base))

            t, rss, uss, mach = rec["epoch_s"], largest_proc_rss(rec), largest_proc_rss(rec, proc_uss), \
                machine_delta(rec)
            rows.append([f"{nodes:,}", mode,
                         f"{t:.2f} ({vs(lambda r: r['epoch_s'], csr, t)}, {vs(lambda r: r['epoch_s'], gp, t)})",
                         f"{gib(rss)} ({vs(largest_proc_rss, csr, rss)})",
                         f"{gib(uss)} ({vs(lambda r: largest_proc_rss(r, proc_uss), csr, uss)})",
                         f"{gib(mach)} ({vs(machine_delta, csr, mach)})"])
    return markdown_table(["nodes", "mode", "epoch s (÷CSR, ÷GP)", "largest process peak RSS GiB (÷CSR)",
                           "peak USS GiB (÷CSR)", "machine peak GiB (÷CSR)"], rows, "llrrrr")


def per_process(rec: dict, measure) -> str:
    """``main / rank0 / rank1`` peaks of one kind (GiB)."""
    procs = rec.get("processes") or {}
    order = sorted(procs, key=lambda r: (r != "main", r))
    return " / ".join(gib(measure(procs[r])) for r in order) or "–"


DETAIL_HEAD = ["nodes", "L", "mode", "status", "epochs timed", "epoch s (median)", "first epoch s", "÷CSR",
               "MiB sent/epoch", "peak RSS GiB (main / rank0 / rank1)", "peak PSS GiB", "peak USS GiB",
               "machine peak GiB (over before)", "machine used at peak GiB", "min available GiB", "graph s", "setup s",
               "wall s", "threads", "last loss"]


def detail_rows(runs: Dict[Rung, dict], model: str) -> List[str]:
    """Every recorded rung of a model with every recorded column."""
    rows = []
    for nodes, _, L, mode in sorted((k for k in runs if k[1] == model and k[3] in MODES),
                                    key=lambda k: (k[0], k[2], MODES.index(k[3]))):
        rec, csr = runs[(nodes, model, L, mode)], runs.get((nodes, model, L, SINGLE))
        good = ok(rec)
        machine = rec.get("machine") or {}
        sent = rec.get("bytes_sent_per_epoch")
        loss = (rec.get("losses") or [None])[-1]
        rows.append([f"{nodes:,}", str(L), mode, rec["status"], str(rec.get("timed_epochs", "–")),
                     f"{rec['epoch_s']:.3f}" if good else "–",
                     f"{rec['epoch_s_all'][0]:.3f}" if good else "–",
                     fmt_ratio(ratio(rec["epoch_s"], csr["epoch_s"])) if good and ok(csr) else "–",
                     f"{sent / 2**20:,.1f}" if sent is not None else "–",
                     per_process(rec, proc_rss), per_process(rec, proc_pss), per_process(rec, proc_uss),
                     gib(machine.get("used_delta")), gib(machine.get("used_peak")), gib(machine.get("available_min")),
                     f"{rec['graph_s']:.1f}" if "graph_s" in rec else "–",
                     f"{rec['mode_setup_s']:.1f}" if "mode_setup_s" in rec else "–",
                     f"{rec['wall_s']:.0f}", str(rec.get("threads", "–")), f"{loss:.4f}" if loss is not None else "–"])
    return markdown_table(DETAIL_HEAD, rows)


def time_split(runs: Dict[Rung, dict]) -> List[str]:
    """Where a 2-process epoch goes, per rank, from the strategies' own ``comm/...`` metrics of the last epoch."""
    rows = []
    for key in sorted(runs):
        rec = runs[key]
        comm = rec.get("comm_last_epoch") or {}
        if not ok(rec) or "comm/step_s/rank0" not in comm:
            continue
        per = lambda name: " / ".join(f"{comm.get(f'comm/{name}/rank{r}', 0.0):.1f}" for r in range(2))  # noqa: E731
        rows.append([rec["model"], str(rec["layers"]), f"{rec['nodes']:,}", rec["mode"], f"{rec['epoch_s']:.1f}",
                     per("step_s"), per("compute_s"), per("bubble_s"), per("wait_s"),
                     gib(rec.get("bytes_sent_per_epoch")), f"{rec['host'].get('load_before', 0):.1f}",
                     "yes" if rec.get("huge_pages") else "no"])
    return markdown_table(["model", "L", "nodes", "mode", "epoch s", "step s", "compute s", "bubble s", "wait s",
                           "GiB sent", "load", "THP"], rows)


def memory_split(runs: Dict[Rung, dict]) -> List[str]:
    """Where a 2-process run's memory goes, per rank, from the breakdown the worker records at the last epoch."""
    rows = []
    for key in sorted(runs):
        rec = runs[key]
        for r, b in enumerate(rec.get("breakdown") or [] if ok(rec) else []):
            kept, now, peak, trim = (b.get(k) or {} for k in ("kept_bytes", "now_bytes", "peak_bytes", "trimmed_bytes"))
            cells = [gib(kept.get(k)) for k in ("history", "chunk_graph", "data")]
            cells += [gib(now.get("uss")), gib(trim.get("uss")), gib(peak.get("uss")), gib(peak.get("rss"))]
            rows.append([rec["model"], str(rec["layers"]), f"{rec['nodes']:,}", rec["mode"], str(r), *cells])
    return markdown_table(["model", "L", "nodes", "mode", "rank", "tables", "chunk graphs", "data (shared)", "USS",
                           "USS trimmed", "peak USS", "peak RSS"], rows)


def failures(runs: Dict[Rung, dict]) -> List[str]:
    """The last lines of the log of every rung whose latest run failed (``["None."]`` when none did)."""
    out = []
    for r in (runs[k] for k in sorted(runs)):
        if not ok(r) and r.get("error_tail"):
            tail = "\n".join(r["error_tail"].splitlines()[-8:])
            out += [f"{r['model']} L={r['layers']} {r['nodes']:,} nodes {r['mode']}: {r['status']}", "", "```",
                    tail, "```", ""]
    return out[:-1] if out else ["None: every rung's latest run finished."]
