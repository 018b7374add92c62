"""``docs/results/scale.md``'s tables and ``scale.png``, written from ``benchmarks/scale/runs.jsonl`` alone (the
records of ``benchmarks/scale/run.py``; nothing is measured here).

The page's prose is hand-written; each generated block sits between ``<!-- BEGIN name -->`` and
``<!-- END name -->`` and is replaced whole (:func:`render`), so a rerun of the benchmark rewrites the figures and
nothing else. The page and its plot from the records alone::

    python -m benchmarks.scale.run --page-only      # or: python -m benchmarks.scale.page

Memory figures: peak RSS of a process is the larger of the sampled RSS (every 0.2 s) and the kernel's ``VmHWM``;
USS and PSS are sampled peaks. The machine's figure is the peak of ``psutil.virtual_memory().used`` during the run
minus its value just before (every process counts: the ranks, the launcher, and other jobs on the machine).
"""

from __future__ import annotations

import statistics
from functools import partial
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from benchmarks.harness.memory import GIB, gib
from benchmarks.harness.page import color, fill_blocks, style_axes
from benchmarks.scale.ratios import MODES, TARGETS, Rung, largest_proc_rss, ok, ratio, rung, targets_table
from benchmarks.scale.tables import (answer_rungs, answer_table, answer_values, detail_rows, failures, memory_split,
                                     mode_table, short, time_split)

__all__ = ["render", "render_notes", "plot", "short", "median_bandwidth", "load_records", "write_page", "PAGE", "PLOT",
           "NOTES",
           # imported from here by run.py
           "MODES", "gib", "largest_proc_rss"]

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "results" / "scale.md"
PLOT = PAGE.with_suffix(".png")
NOTES = PAGE.parent / "notes" / "scale.md"


def latest(records: Iterable[dict]) -> Dict[Rung, dict]:
    """The latest record per rung (records oldest first), planner estimates left out."""
    runs: Dict[Rung, dict] = {}
    for rec in records:
        if rec["mode"] != "planner":
            runs[rung(rec)] = rec
    return runs


def models_layers(runs: Dict[Rung, dict]) -> List[Tuple[str, int]]:
    """The measured (model, layers) pairs, GCN first, shallow first."""
    return sorted({(k[1], k[2]) for k in runs}, key=lambda p: (p[0] != "gcn", p[0], p[1]))


def modes_block(runs: Dict[Rung, dict]) -> List[str]:
    """One table per measured (model, layers): every measured mode by graph size."""
    out: List[str] = []
    for model, layers in models_layers(runs):
        out += [f"#### {model.upper()}, {layers} layers", "", *mode_table(runs, model, layers), ""]
    return out[:-1]


def details_block(runs: Dict[Rung, dict]) -> List[str]:
    """Every recorded column of every measured rung, one table per model."""
    out: List[str] = []
    for model in sorted({k[1] for k in runs}, key=lambda m: (m != "gcn", m)):
        out += [f"#### {model.upper()}", "", *detail_rows(runs, model), ""]
    return out[:-1]


def setup_block(records: List[dict]) -> List[str]:
    """Machine(s), load, software versions and package commits of ``records`` (the page's: the latest per rung)."""
    hosts = sorted({f"{r['host']['hostname']}: {r['host']['cpu']}, {r['host']['cores']} cores, "
                    f"{gib(r['host']['memory'])} GiB RAM" for r in records if r.get("host")})
    vers = sorted({", ".join(f"{k} {v}" for k, v in r["versions"].items()) for r in records if r.get("versions")})
    commits = sorted({f"{r['git']['commit']}{' (dirty tree)' if r['git'].get('dirty') else ''}"
                      for r in records if r.get("git")})
    loads = [r["host"][k] for r in records for k in ("load_before", "load_after") if r.get("host", {}).get(k) is not None]
    load = f" Load average (1 min) before / after the runs: {min(loads):.1f}–{max(loads):.1f}." if loads else ""
    return [f"Machine: {'; '.join(hosts) or '–'}.{load}", "",
            f"Software: {'; '.join(vers) or '–'}. Package commits: {', '.join(commits) or '–'}."]


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


def commands_block(runs: Dict[Rung, dict]) -> List[str]:
    """The command lines that produced the latest record of every rung."""
    commands = sorted({"python -m benchmarks.scale.run " + " ".join(portable(r["argv"]))
                       for r in runs.values() if "argv" in r})
    return ["```bash", *commands, "```"]


BLOCKS: Dict[str, Callable[[Dict[Rung, dict], List[dict]], List[str]]] = {
    "answer": lambda runs, _: answer_table(runs),
    "setup": lambda runs, _: setup_block(list(runs.values())),
    "modes": lambda runs, _: modes_block(runs),
    "time": lambda runs, _: time_split(runs),
    "memory": lambda runs, _: memory_split(runs),
    "every_column": lambda runs, _: details_block(runs),
    "failures": lambda runs, _: failures(runs),
    "commands": lambda runs, _: commands_block(runs),
}
"""The page's generated blocks, by name: each builder gets the latest record per rung and every record."""


def render(records: List[dict], text: Optional[str] = None) -> Tuple[str, Dict[Rung, dict]]:
    """The page with every generated block written from ``records``, and the latest record per rung.

    Args:
        records: Records of one setup (graph and hidden width), oldest first.
        text: The page to fill (default: ``docs/results/scale.md`` as it is).

    Raises:
        ValueError: A block's markers are missing from ``text``.
    """
    runs = latest(records)
    text = PAGE.read_text() if text is None else text
    return fill_blocks(text, {name: partial(build, runs, records) for name, build in BLOCKS.items()}, str(PAGE)), runs


def targets_block(runs: Dict[Rung, dict]) -> List[str]:
    """The targets' meanings, then one table of verdicts per measured model."""
    out = [f"- **{d}**: {meaning}." for _, d, _, _, meaning in TARGETS] + [""]
    for model in sorted({k[1] for k in runs}, key=lambda m: (m != "gcn", m)):
        out += [f"### {model.upper()}", "", *targets_table(runs, model), ""]
    return out[:-1]


def render_notes(records: List[dict], text: Optional[str] = None) -> str:
    """``docs/results/notes/scale.md`` (``text``, default: the file as it is) with its targets' table written from
    ``records``.

    Raises:
        ValueError: The block's markers are missing from ``text``.
    """
    runs = latest(records)
    text = NOTES.read_text() if text is None else text
    return fill_blocks(text, {"targets": partial(targets_block, runs)}, str(NOTES))


def conclusion(runs: Dict[Rung, dict]) -> str:
    """The plot's title: the ranges of the answer's three ratios."""
    spans = {}
    for what in ("epoch", "uss", "machine"):
        found = [ratio(*answer_values(runs, k)[what]) for k in answer_rungs(runs)]
        spans[what] = f"{min(found):.2f}–{max(found):.2f}x" if found else "–"
    return (f"GNNPipeStrategy() on 2 processes against one process: epoch time {spans['epoch']}, largest rank's memory "
            f"{spans['uss']};\nthe machine as a whole holds more ({spans['machine']}): two ranks and the launcher")


def plot(runs: Dict[Rung, dict], models: Optional[list] = None, layers_list: Optional[list] = None,
         png: Path = PLOT) -> None:
    """Epoch seconds (left) and memory (right: the largest process's peak USS, solid; the machine's peak, dashed)
    against graph size, for the answer's rungs: the default on 2 processes and one CSR process.

    ``models`` and ``layers_list`` are accepted for ``run.py``'s call and not used: the answer's rungs are drawn.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = answer_rungs(runs)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    if keys:
        nodes = [k[0] for k in keys]
        values = [answer_values(runs, k) for k in keys]
        for i, (method, name) in enumerate((("gnnpipe", "GNNPipeStrategy(), 2 processes"),
                                            ("exact", "one process (CSR)"))):
            left.plot(nodes, [v["epoch"][i] for v in values], "-o", color=color(method), label="_nolegend_")
            right.plot(nodes, [v["uss"][i] / GIB for v in values], "-o", color=color(method),
                       label=f"{name}: {'largest rank' if i == 0 else 'the process'}, peak USS")
            right.plot(nodes, [v["machine"][i] / GIB for v in values], "--s", color=color(method),
                       label=f"{name}: machine's peak")
        for ax in (left, right):
            ax.set_xscale("log")
            ax.set_xticks(nodes, [short(n) for n in nodes], minor=False)
            ax.set_xticks([], minor=True)
            ax.set_xlim(nodes[0] / 1.3, nodes[-1] * 1.3)
            ax.set_ylim(0, None)
        left.text(0.03, 0.95, "blue: GNNPipeStrategy(), 2 processes\ngrey: one process (CSR)", transform=left.transAxes,
                  va="top", fontsize=7)
    model = f"{keys[0][1].upper()}-{keys[0][2]}, " if keys else ""
    style_axes(left, "graph size (nodes; 20 edges a node)", "epoch time (s, median)", f"{model}epoch time")
    style_axes(right, "graph size (nodes; 20 edges a node)", "peak memory (GiB)", f"{model}memory")
    fig.suptitle(conclusion(runs), fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def median_bandwidth(records: List[dict]) -> Optional[float]:
    """Median rank-0/rank-1 bandwidth measured at the start of the 2-process runs (bytes/s), or ``None``."""
    found = [r["bandwidth_Bps"] for r in records if ok(r) and r.get("bandwidth_Bps")]
    return statistics.median(found) if found else None


def load_records() -> List[dict]:
    """The records of ``benchmarks/scale/runs.jsonl`` with the benchmark's default graph and width, oldest first (the
    records ``python -m benchmarks.scale.run --page-only`` writes the page from)."""
    from benchmarks.harness.records import load_cache
    from benchmarks.scale.run import parse_args, same_setup

    args = parse_args([])
    return [r for r in load_cache(args.cache) if same_setup(r, args)]


def write_page(page: Path = PAGE, png: Path = PLOT, notes: Path = NOTES, records: Optional[List[dict]] = None) -> str:
    """Rewrite the generated blocks of ``page`` and ``notes`` and redraw ``png`` from ``records`` (default:
    :func:`load_records`); returns the page."""
    records = load_records() if records is None else records
    text, runs = render(records, text=page.read_text())
    page.write_text(text)
    notes.write_text(render_notes(records, notes.read_text()))
    plot(runs, png=png)
    return text


if __name__ == "__main__":
    write_page()
    print(f"wrote {PAGE}, {NOTES} and {PLOT}")
