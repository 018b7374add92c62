"""``docs/results/time_to_accuracy.md`` from the cached records of ``bench.py`` (nothing is measured here)::

    python -m benchmarks.time_to_accuracy.page   # the page's tables and plots from runs.jsonl

The page is hand-written prose with generated blocks (:func:`benchmarks.harness.page.fill_blocks`); every figure in
a block is read from the records. Derived figures, per (graph, model, seed):

* target: 99% of the exact single process's best validation accuracy over its epochs;
* epochs to it: the first epoch (counted from 1) whose validation accuracy reaches the target;
* seconds to it: those epochs times the mode's epoch (training and validation) measured in a quiet short run;
* test accuracy at the run's best validation epoch (the first such epoch on ties).

Under an emulated link the numerics do not change (the same processes compute the same values; only their transfers
are slower), so the time to accuracy at rate ``R`` is the free-link run's epochs to the target times the epoch
(training and validation) measured at ``R``.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import List, Optional, Sequence

from benchmarks.harness.page import color, fill_blocks, fmt_ratio, markdown_table, style_axes
from benchmarks.harness.records import load_cache
from benchmarks.time_to_accuracy.accuracy import accuracy_table, defaults_run, derive
from benchmarks.time_to_accuracy.link_tables import (LINK_SESSION, link_runs, link_summary, link_table, rate_lines,
                                                     ratio, time_split)
from benchmarks.time_to_accuracy.rates import derived_rates
from benchmarks.time_to_accuracy.run_records import EXACT_FORWARD, GRAPHS, ok, timed

__all__ = ["render", "write_page", "figures", "PAGE", "PLOT", "LINK_PLOT",
           # imported from here by bench.py and planner.py
           "EXACT_FORWARD", "LINK_SESSION", "link_runs", "ok", "timed"]

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "results" / "time_to_accuracy.md"
PLOT = PAGE.with_suffix(".png")
LINK_PLOT = PAGE.with_name("time_to_accuracy_link.png")
CACHE = Path(__file__).resolve().parent / "runs.jsonl"
SPREAD_CONNECTORS = 1.0
"""The spread graph's ``connectors`` (``bench.SPREAD``): its records are the spread graph's, every other the page's."""
PAPER_SPEEDUP = 1.58
"""GNNPipe's speed-up over graph parallelism that the paper reports (an epoch); the link plot's reference line."""
MODEL_ORDER = ("gcnii16", "ressage8")


def load(cache: Path = CACHE) -> List[dict]:
    """Cached records, the latest per key (as ``bench.load``, without importing the benchmark)."""
    return list({rec["key"]: rec for rec in load_cache(cache)}.values())


def figures(records: List[dict]) -> dict:
    """Everything the page's blocks and plots read, from ``records`` (both graphs' runs): the rates, each graph's
    accuracy figures (:func:`derive`) and link summary (:func:`link_summary`)."""
    by_graph = {"page": [r for r in records if r["spec"]["graph"].get("connectors") != SPREAD_CONNECTORS],
                "spread": [r for r in records if r["spec"]["graph"].get("connectors") == SPREAD_CONNECTORS]}
    rates = derived_rates(by_graph["page"])
    derived = {g: derive(recs) for g, recs in by_graph.items()}
    summary = [row for g in GRAPHS for row in link_summary(by_graph[g], derived[g], rates, g)]
    return {"rates": rates, "derived": derived, "summary": summary}


def rate_of(fig: dict, gbit: int) -> Optional[float]:
    """The emulated rate (bits/s) that stands for ``gbit`` Gbit/s between GPUs."""
    return fig["rates"][gbit]["rate_bits"] if gbit in fig["rates"] else None


def answer_rows(fig: dict) -> List[dict]:
    """The answer's rows: per graph and model, the free link and the 100 Gbit/s rate."""
    rows = [r for r in fig["summary"] if r["rate"] in (None, rate_of(fig, 100))]
    return sorted(rows, key=lambda r: (list(GRAPHS).index(r["graph"]), MODEL_ORDER.index(r["model"]),
                                       r["rate"] is not None))


def answer(fig: dict) -> List[str]:
    """Seconds to 99% of exact training's best validation accuracy (300k nodes, seed 0) for the single process,
    GNNPipe's defaults and graph parallelism, and graph parallelism's epoch over GNNPipe's."""
    def s(x: Optional[float]) -> str:
        return "–" if x is None else f"{x:,.0f}"

    rows = []
    for r in answer_rows(fig):
        epoch = ratio(r["epoch"]["graph_parallel"], r["epoch"]["gnnpipe"])
        link = "free" if r["rate"] is None else r["name"].split(" (")[0]
        rows.append([f"{r['model']}, {GRAPHS[r['graph']]}", link, s(r["exact_s"]), s(r["to_acc"]["gnnpipe"]),
                     s(r["to_acc"]["graph_parallel"]), "–" if epoch is None else fmt_ratio(epoch)])
    return markdown_table(["model, graph", "link", "one process: s to 99%", "GNNPipe: s to 99%",
                           "graph parallel: s to 99%", "GP ÷ GNNPipe epoch"], rows, "llrrrr")


def first(row: dict) -> str:
    """Which mode reaches the target first in a summary row: ``exact``, ``gnnpipe`` or ``graph_parallel``."""
    times = {"exact": row["exact_s"], **{m: row["to_acc"][m] for m in ("gnnpipe", "graph_parallel")}}
    return min((m for m in times if times[m]), key=lambda m: times[m])


NAMES = {"exact": "one process", "gnnpipe": "GNNPipe", "graph_parallel": "graph parallelism"}


def plot_title(rows: List[dict]) -> str:
    """The accuracy plot's conclusion, from the rows it draws: who is first on each link, and whether GNNPipe is
    before graph parallelism everywhere."""
    parts = []
    for link in ("on the free link", "at 100 Gbit/s"):
        won = {first(r) for r in rows if (r["rate"] is None) == (link == "on the free link")}
        parts.append(f"{' and '.join(sorted(NAMES[w] for w in won))} first {link}" if won else "")
    before = all(r["to_acc"]["gnnpipe"] and r["to_acc"]["graph_parallel"]
                 and r["to_acc"]["gnnpipe"] < r["to_acc"]["graph_parallel"] for r in rows)
    tail = "GNNPipe before graph parallelism in every panel" if before else "GNNPipe not always before graph parallelism"
    return f"Page's graph, 300k nodes, to 99% of exact's best (dotted): {'; '.join(p for p in parts if p)};\n{tail}"


def plot(fig: dict, path: Path = PLOT) -> None:
    """Validation accuracy against wall seconds on the page's graph, a panel per model and link (free, 100 Gbit/s),
    a line per mode; the dotted line is 99% of exact's best validation accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    derived = fig["derived"]["page"]
    rows = [r for r in answer_rows(fig) if r["graph"] == "page"]
    figure, axes = plt.subplots(2, 2, figsize=(10, 6.6), sharey="row")
    for ax, r in zip(axes.flat, rows):
        exact = derived[(300_000, r["model"], "exact", 0)]
        curves = {"exact": (exact, exact["train_s"] + exact["val_s"]),
                  "gnnpipe": (defaults_run(derived, 300_000, r["model"], 0), r["epoch"]["gnnpipe"]),
                  "graph_parallel": (derived.get((300_000, r["model"], "graph_parallel", 0)) or exact,
                                     r["epoch"]["graph_parallel"])}
        for mode, (run, epoch) in curves.items():
            if run is None or not epoch:
                continue
            xs = [epoch * (i + 1) for i in range(len(run["curve"]))]
            ax.plot(xs, run["curve"], color=color(mode), marker=".", markersize=3, linewidth=1.2, label=NAMES[mode])
        ax.axhline(exact["target"], color="black", linestyle=":", linewidth=1, label="99% of exact's best")
        ax.set_ylim(max(0.0, exact["target"] - 0.25), exact["target"] + 0.04)
        style_axes(ax, "wall seconds (s)", "validation accuracy", f"{r['model']}, {r['name']}")
        if ax is not axes.flat[1]:
            ax.get_legend().remove()
    figure.suptitle(plot_title(rows), fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def link_title(rows: List[dict]) -> str:
    """The link plot's conclusion: per graph, the rates at which graph parallelism's GCNII-16 epoch is at least
    1.58x GNNPipe's."""
    parts = []
    for graph, name in GRAPHS.items():
        above = sorted(r["gbit"] for r in rows if r["graph"] == graph and r["gbit"]
                       and (ratio(r["epoch"]["graph_parallel"], r["epoch"]["gnnpipe"]) or 0) >= PAPER_SPEEDUP)
        parts.append(f"{', '.join(map(str, above)) + ' Gbit/s' if above else 'no rate'} ({name})")
    return (f"gcnii16: graph parallelism's epoch is at least the paper's {PAPER_SPEEDUP}x GNNPipe's "
            f"at {' and '.join(parts)}")


def plot_link(fig: dict, path: Path = LINK_PLOT) -> None:
    """GCNII-16's epoch against the link rate (the GPU link each emulated rate stands for), GNNPipe against graph
    parallelism, a panel per graph, with the paper's speed-up as a reference (graph parallelism at 1.58x GNNPipe)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    rows = [r for r in fig["summary"] if r["model"] == "gcnii16" and r["gbit"]]
    ticks = sorted({r["gbit"] for r in rows})
    figure, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharex=True, sharey=True)
    for ax, graph in zip(axes, GRAPHS):
        mine = sorted((r for r in rows if r["graph"] == graph), key=lambda r: r["gbit"])
        xs = [r["gbit"] for r in mine]
        for mode in ("gnnpipe", "graph_parallel"):
            ax.plot(xs, [r["epoch"][mode] for r in mine], color=color(mode), marker="o", label=NAMES[mode])
        ax.plot(xs, [PAPER_SPEEDUP * r["epoch"]["gnnpipe"] for r in mine], color=color("graph_parallel"),
                linestyle="--", linewidth=1, label=f"{PAPER_SPEEDUP}x GNNPipe (paper)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(ticks, [str(x) for x in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_yticks([10, 20, 50, 100, 200, 500])
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        style_axes(ax, "link between GPUs, emulated (Gbit/s)", "epoch: training + validation (s)",
                   GRAPHS[graph])
        if graph == "page":
            ax.get_legend().remove()
    figure.suptitle(link_title(rows), fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


BLOCKS = {"answer": answer, "link": lambda fig: link_table(fig["summary"]),
          "time_split": lambda fig: time_split([r for r in fig["summary"] if r["graph"] == "page"]),
          "accuracy": lambda fig: accuracy_table(fig["derived"]), "rates": lambda fig: rate_lines(fig["rates"])}


def render(records: List[dict], text: str, page: Path = PAGE) -> str:
    """``text`` (the page) with every generated block replaced by the tables of ``records``.

    Raises:
        ValueError: A block's markers are missing.
    """
    fig = figures(records)
    return fill_blocks(text, {name: partial(build, fig) for name, build in BLOCKS.items()}, str(page))


def write_page(records: List[dict], path: Path = PAGE, spread: Sequence[dict] = ()) -> None:
    """Replace every generated block of ``path`` with the tables of ``records`` and ``spread`` (the spread graph's
    runs, when ``records`` holds only the page's graph's) and redraw both plots. The planner's figures and the
    alternating pairs are accounted for in ``docs/results/notes/time_to_accuracy.md``, not here."""
    records = list(records) + [r for r in spread if r not in records]
    path.write_text(render(records, path.read_text(), path))
    fig = figures(records)
    plot(fig)
    plot_link(fig)


def main() -> None:
    """Regenerate the page and its plots from the cached records."""
    write_page(load())
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
