"""``docs/results/performance.md``'s tables and plot, written from ``docs/results/performance.json`` alone.

The records are what ``benchmarks/performance/parallelism.py`` appended: ``analytic`` (bytes per epoch from the
formulas, nothing trained) and ``measured`` (one ``Trainer.fit`` each). The page's prose is hand-written; each
generated block sits between ``<!-- BEGIN name -->`` and ``<!-- END name -->`` and is replaced whole, so::

    python -m benchmarks.performance.page

rewrites the figures and the plot, and nothing else.
"""

from __future__ import annotations

import json
import statistics
from functools import partial
from pathlib import Path
from typing import Dict, List, Optional

from benchmarks.harness.page import color, fill_blocks, fmt_ratio, markdown_table, style_axes

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "docs" / "results" / "performance.json"
PAGE = ROOT / "docs" / "results" / "performance.md"
PLOT = ROOT / "docs" / "results" / "performance.png"
COMMAND = "python -m benchmarks.performance.page"
MIB = 2**20
PROCS = 4  # the answer's process count: every graph was measured with it
NAMES = {"cora": "Cora", "tolokers": "Tolokers", "cornell5": "Cornell5", "sbm": "SBM-200k"}
MODES = {"single": "one process", "gnnpipe": "GNNPipe", "graph_parallel": "graph parallelism", "hybrid": "hybrid"}
PLOT_COLORS = {"single": color("exact"), "gnnpipe": color("gnnpipe"), "graph_parallel": color("graph_parallel"),
               "hybrid": color("hybrid")}


def load(path: Path = RECORDS) -> dict:
    """The records: ``{"analytic": [...], "measured": [...]}``."""
    return json.loads(path.read_text())


def name(dataset: str) -> str:
    """The page's name of a dataset."""
    return NAMES.get(dataset, dataset)


def order(dataset: str) -> int:
    return list(NAMES).index(dataset) if dataset in NAMES else len(NAMES)


def mib(b: float) -> str:
    return f"{b / MIB:,.2f}"


def sent(rec: dict) -> int:
    return sum(rec.get("sent", {}).values())


def find(measured: List[dict], dataset: str, mode: str, procs: int, layers: int,
         chunks: Optional[int] = None) -> Optional[dict]:
    """The first run of ``mode`` on ``dataset`` with ``procs`` processes, ``layers`` layers (and ``chunks``)."""
    for r in measured:
        if (r["dataset"], r["mode"], r["procs"], r["layers"]) == (dataset, mode, procs, layers) and \
                (chunks is None or r["chunks"] == chunks):
            return r
    return None


def cases(records: dict, procs: int = PROCS) -> List[dict]:
    """Every (graph, depth) measured with GNNPipe and graph parallelism on ``procs`` processes: its runs by mode
    (GNNPipe and hybrid with ``K = 4 procs`` chunks, one process where it ran)."""
    measured = records["measured"]
    keys = sorted({(r["dataset"], r["layers"]) for r in measured if r["procs"] == procs},
                  key=lambda k: (order(k[0]), k[1]))
    out = []
    for dataset, layers in keys:
        runs = {"single": find(measured, dataset, "single", 1, layers),
                "gnnpipe": find(measured, dataset, "gnnpipe", procs, layers, 4 * procs),
                "graph_parallel": find(measured, dataset, "graph_parallel", procs, layers),
                "hybrid": find(measured, dataset, "hybrid", procs, layers, 4 * procs)}
        if runs["gnnpipe"] and runs["graph_parallel"]:
            out.append({"dataset": dataset, "layers": layers, "runs": {m: r for m, r in runs.items() if r}})
    return out


def fastest(case: dict) -> str:
    """The mode with the shortest epoch in ``case``."""
    return min(case["runs"], key=lambda m: case["runs"][m]["epoch_s"])


def speedup(case: dict, slow: str, fast: str) -> str:
    """``slow``'s epoch over ``fast``'s, or ``–`` where one of them was not run."""
    runs = case["runs"]
    return fmt_ratio(runs[slow]["epoch_s"] / runs[fast]["epoch_s"]) if slow in runs and fast in runs else "–"


def answer(records: dict) -> List[str]:
    """Per graph and depth, 4 processes: GNNPipe's epoch against one process and graph parallelism, the hybrid's
    against GNNPipe's, the bytes ratio, and the shortest epoch."""
    rows = []
    for c in cases(records):
        best = fastest(c)
        rows.append([f"{name(c['dataset'])}, L = {c['layers']}", speedup(c, "single", "gnnpipe"),
                     speedup(c, "graph_parallel", "gnnpipe"), speedup(c, "gnnpipe", "hybrid"),
                     fmt_ratio(sent(c["runs"]["graph_parallel"]) / sent(c["runs"]["gnnpipe"])),
                     f"{MODES[best]}, {c['runs'][best]['epoch_s']:.2f} s"])
    return markdown_table(["graph, layers", "GNNPipe's speed-up over one process",
                           "GNNPipe's speed-up over graph parallelism", "hybrid's speed-up over GNNPipe",
                           "bytes, graph parallelism ÷ GNNPipe", "shortest epoch"], rows, "lrrrrl")


def title(records: dict) -> str:
    """The plot's title: where a pipeline (GNNPipe or hybrid) had the shortest epoch, and where it did not."""
    all_cases = cases(records)
    pipe = [name(d) for d in dict.fromkeys(c["dataset"] for c in all_cases)
            if all(fastest(c) in ("gnnpipe", "hybrid") for c in all_cases if c["dataset"] == d)]
    other = [c for c in all_cases if fastest(c) not in ("gnnpipe", "hybrid")]
    head = f"Shortest epoch, {PROCS} processes on one host: GNNPipe or hybrid on every {words(pipe)} run"
    if not other:
        return head
    winners = words([MODES[m] for m in dict.fromkeys(fastest(c) for c in other)])
    where = "; ".join(f"{name(d)} at L = {words([str(c['layers']) for c in other if c['dataset'] == d])}"
                      for d in dict.fromkeys(c["dataset"] for c in other))
    return f"{head};\n{winners} only on {where}"


def words(items: List[str]) -> str:
    """``a``, ``a and b``, ``a, b and c`` (``none`` for no items)."""
    if not items:
        return "none"
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def plot(records: dict, png: Path = PLOT) -> None:
    """Epoch time per graph and depth, one bar per mode (log scale), to ``png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    all_cases = cases(records)
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.2
    for i, mode in enumerate(MODES):
        xs = [j + (i - 1.5) * width for j, c in enumerate(all_cases) if mode in c["runs"]]
        ys = [c["runs"][mode]["epoch_s"] for c in all_cases if mode in c["runs"]]
        ax.bar(xs, ys, width, color=PLOT_COLORS[mode], label=MODES[mode])
    ax.set_xticks(range(len(all_cases)), [f"{name(c['dataset'])}\nL = {c['layers']}" for c in all_cases], fontsize=8)
    ax.set_yscale("log")
    style_axes(ax, "graph and number of layers L", "seconds per epoch (median, log scale)", title(records))
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def bandwidth(records: dict) -> List[str]:
    """The point-to-point bandwidth measured at the start of every multi-process run, one sentence."""
    found = [r["bandwidth_Bps"] for r in records["measured"] if r.get("bandwidth_Bps")]
    if not found:
        return ["No bandwidth is recorded."]
    return ["Point-to-point bandwidth, measured by `lightning_gnnpipe.planner.cost.measure_bandwidth` (16 MiB "
            "ping-pong between ranks 0 and 1) at the start of every multi-process run: "
            f"median {statistics.median(found) / 1e9:.1f} GB/s over {len(found)} runs "
            f"({min(found) / 1e9:.2f} to {max(found) / 1e9:.1f} GB/s; gloo over loopback)."]


def transfer(records: dict) -> List[str]:
    """How long the largest measured volume takes at the median bandwidth, against its epoch, one sentence."""
    runs = [r for r in records["measured"] if sent(r)]
    found = [r["bandwidth_Bps"] for r in records["measured"] if r.get("bandwidth_Bps")]
    if not runs or not found:
        return ["No multi-process run is recorded."]
    big = max(runs, key=sent)
    seconds = sent(big) / statistics.median(found)
    return [f"At the median bandwidth the largest volume measured, {mib(sent(big))} MiB an epoch "
            f"({name(big['dataset'])}, L = {big['layers']}, {MODES[big['mode']]}), takes {seconds:.1f} s of a "
            f"{big['epoch_s']:.0f} s epoch."]


def ranks(values: List[float], fmt: str) -> str:
    return " / ".join(format(v, fmt) for v in values)


def measured(records: dict) -> List[str]:
    """Every measured run: epoch, bytes against the formulas and the minimum, wait per rank, bubble, peak RSS."""
    rows = []
    for r in sorted(records["measured"], key=lambda r: (order(r["dataset"]), r["layers"], list(MODES).index(r["mode"]),
                                                        r["procs"], r["chunks"])):
        if r["mode"] == "single":
            rows.append([name(r["dataset"]), MODES["single"], 1, 1, r["layers"], f"{r['epoch_s']:.3f}", "–", "–", "–",
                         "–", f"{max(r['peak_rss_mib']):,.0f}"])
            continue
        analytic = sum(r["analytic"].values())
        bytes_cell = mib(sent(r)) + ("" if sent(r) == analytic else f" (formula {mib(analytic)})")
        bubble = statistics.mean(b / s for b, s in zip(r["bubble_s"], r["step_s"]))
        rows.append([name(r["dataset"]), MODES[r["mode"]], r["procs"], r["chunks"], r["layers"], f"{r['epoch_s']:.3f}",
                     bytes_cell, f"{sent(r) / r['minimum']:.3f}", ranks(r["wait_s"], ".2f"), f"{bubble:.3f}",
                     f"{max(r['peak_rss_mib']):,.0f}"])
    return markdown_table(["graph", "mode", "P", "K", "L", "epoch s", "MiB sent", "sent ÷ minimum",
                           "wait s, rank 0 / 1 / ...", "bubble fraction (mean)", "peak RSS MiB (largest rank)"],
                          rows, "llrrrrrrlrr")


def efficiency(records: dict) -> List[str]:
    """GNNPipe's pipeline efficiency ``T(1) / (S T(S))`` against the bubble bound, wherever one process ran."""
    rows = []
    for r in records["measured"]:
        one = find(records["measured"], r["dataset"], "single", 1, r["layers"])
        if r["mode"] != "gnnpipe" or one is None:
            continue
        s, k = r["procs"], r["chunks"]
        bound = (s - 1) / (k + s - 1)
        bubble = statistics.mean(b / t for b, t in zip(r["bubble_s"], r["step_s"]))
        rows.append([name(r["dataset"]), s, k, r["layers"], f"{one['epoch_s'] / (s * r['epoch_s']):.2f}",
                     f"{1 - bound:.3f}", f"{bubble:.3f}", f"{bound:.3f}"])
    return markdown_table(["graph", "S", "K", "L", "efficiency T(1) / (S T(S))", "bound 1 - (S-1)/(K+S-1)",
                           "bubble fraction, measured", "bubble bound (S-1)/(K+S-1)"], rows, "lrrrrrrr")


def volumes(records: dict) -> List[str]:
    """Bytes per epoch from the formulas for every graph, process count and depth, and their summary."""
    rows, deep = [], []
    for r in sorted(records["analytic"], key=lambda r: (order(r["dataset"]), r["procs"], r["layers"])):
        rows.append([name(r["dataset"]), r["procs"], r["layers"], f"{r['halo']:,}", mib(r["gp_bytes"]),
                     mib(r["pipe_bytes"]), mib(r["hybrid_bytes"]) if "hybrid_bytes" in r else "–",
                     fmt_ratio(r["ratio"])])
        if r["layers"] >= 16:
            deep.append(r["ratio"])
    out = markdown_table(["graph", "P", "L", "halo rows H", "graph parallelism", "GNNPipe", "hybrid 2 x P/2",
                          "graph parallelism ÷ GNNPipe"], rows, "lrrrrrrr")
    if deep:
        top = max(records["analytic"], key=lambda r: r["ratio"])
        out += ["", f"Graph parallelism ÷ GNNPipe, mean over the {len(deep)} rows with L >= 16: "
                    f"{fmt_ratio(statistics.mean(deep))}; largest {fmt_ratio(top['ratio'])} ({name(top['dataset'])}, "
                    f"P = {top['procs']}, L = {top['layers']})."]
    return out


BLOCKS = {"answer": answer, "bandwidth": bandwidth, "transfer": transfer, "measured": measured,
          "volumes": volumes, "efficiency": efficiency}


def render(records: dict, text: str, page: Path = PAGE) -> str:
    """``text`` (the page) with every generated block replaced by what ``records`` give.

    Raises:
        ValueError: A block's markers are missing.
    """
    return fill_blocks(text, {block: partial(build, records) for block, build in BLOCKS.items()}, str(page))


def write_page(records: Optional[dict] = None, page: Path = PAGE, png: Path = PLOT) -> str:
    """Rewrite every generated block of ``page`` and redraw ``png`` from ``records`` (default: the JSON records);
    return the page's path."""
    records = load() if records is None else records
    page.write_text(render(records, page.read_text(), page))
    plot(records, png)
    return str(page)


def main() -> Dict[str, str]:
    """``python -m benchmarks.performance.page``: the page and its plot from ``docs/results/performance.json``."""
    out = {"page": write_page(), "plot": str(PLOT)}
    print(f"wrote {out['page']} and {out['plot']}")
    return out


if __name__ == "__main__":
    main()
