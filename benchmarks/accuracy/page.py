"""``docs/results/accuracy.md``'s tables and plot, written from ``benchmarks/accuracy/runs.jsonl`` alone.

    python -m benchmarks.accuracy.page    # page-only: rewrites the page's generated blocks and its PNG; runs nothing

A *pair* is a dataset and one of the published models (:data:`MODELS`) with exact and ``pipe-K8-default`` runs at
lr 0.005 and weight decay 5e-4. A mode is compared with exact over the seeds both ran, at the pair's longest runs
(most epochs), then with the most seeds. The figures follow ``report.py``'s tables: test metric in points (mean over
the seeds), gap = the mode's mean minus exact's, its std error that of the per-seed differences, epochs ratio = the
mode's mean epochs to 99% of its best validation metric over exact's. A pair is *within the criterion* when its gap
is at least -0.5 points and its ratio at most 1.2; *not informative* when every run of it, in every mode, reaches
99% of its best validation metric within the first :data:`STILL` epochs (nothing is learnt after its start).

``pipe-K8-default`` is ``refresh_every=0``, the strategy's default when the runs were made; today's default,
``refresh_every="auto"``, refreshes every epoch when the fit validates every epoch: ``pipe-K8-refresh1``.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from benchmarks.harness.page import color, differences, fill_blocks, fmt_ratio, markdown_table, style_axes

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "results" / "accuracy.md"
PLOT = ROOT / "docs" / "results" / "accuracy.png"
RECORDS = ROOT / "benchmarks" / "accuracy" / "runs.jsonl"
DATASETS = ["Cora", "CiteSeer", "Actor", "Tolokers", "Cornell5"]
MODELS = {"resgcn4": "ResGCN-4", "resgcn8": "ResGCN-8", "resgcn16": "ResGCN-16", "sage8": "GraphSAGE-8",
          "gat4": "GAT-4", "gcnii16": "GCNII-16", "gcnii32": "GCNII-32"}
LR, WEIGHT_DECAY = 0.005, 5e-4
GAP_FLOOR, RATIO_CAP, STILL = -0.5, 1.2, 3
MEASURED = "pipe-K8-default"  # refresh_every=0
TODAY = "pipe-K8-refresh1"  # refresh_every="auto" with validation every epoch
OPTIONS = {"pipe-K8-momentum": "`history_momentum=0.5`", "pipe-K8-momentum90": "`history_momentum=0.9`",
           "pipe-K8-halograd": '`halo_gradients="stale"`', "pipe-K8-refresh10": "`refresh_every=10`",
           "pipe-K2-default": "K = 2", "pipe-K4-default": "K = 4", "pipe-K16-default": "K = 16"}
"""Modes that add one option to ``pipe-K8-default`` (``refresh_every=0``), and the option's name."""
LABELS = {MEASURED: "`refresh_every=0`", TODAY: "today's default (refresh every epoch)", **OPTIONS}

Runs = Dict[Tuple[str, str, str, int], Dict[int, dict]]  # (dataset, model, mode, epochs) -> seed -> record


@dataclass(frozen=True)
class Comparison:
    """One mode of one pair against exact over the same seeds and epochs."""

    dataset: str
    model: str
    mode: str
    epochs: int
    seeds: int
    gap: float
    se: Optional[float]
    ratio: float

    @property
    def within(self) -> bool:
        """Gap at least -0.5 points and epochs ratio at most 1.2."""
        return self.gap >= GAP_FLOOR and self.ratio <= RATIO_CAP

    @property
    def excess(self) -> float:
        """How far outside the criterion, each limit's excess relative to it (0 within)."""
        return max(0.0, GAP_FLOOR - self.gap) / -GAP_FLOOR + max(0.0, self.ratio / RATIO_CAP - 1)


def load(path: Path = RECORDS) -> List[dict]:
    """The benchmark's records, oldest first."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def index(records: List[dict]) -> Runs:
    """The records at lr 0.005 and weight decay 5e-4 by (dataset, model, mode, epochs) and seed (a later one wins)."""
    runs: Runs = {}
    for r in records:
        if r["lr"] == LR and r.get("weight_decay", WEIGHT_DECAY) == WEIGHT_DECAY:
            runs.setdefault((r["dataset"], r["model"], r["mode"], r["epochs"]), {})[r["seed"]] = r
    return runs


def compare(runs: Runs, dataset: str, model: str, mode: str, epochs: Optional[int] = None,
            seeds: Optional[List[int]] = None) -> Optional[Comparison]:
    """``mode`` against exact on the pair, at ``epochs`` (default: the most both ran) over ``seeds`` (default: every
    seed both ran); ``None`` where they share no run."""
    settings = sorted((e for (d, m, mo, e) in runs if (d, m, mo) == (dataset, model, mode)), reverse=True)
    for e in ([epochs] if epochs else settings):
        a, b = runs.get((dataset, model, "exact", e), {}), runs.get((dataset, model, mode, e), {})
        common = sorted(set(a) & set(b) & set(seeds if seeds is not None else b))
        if not common:
            continue
        ex, mo = [100 * a[s]["test"] for s in common], [100 * b[s]["test"] for s in common]
        diffs = [y - x for x, y in zip(ex, mo)]
        se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None
        ratio = statistics.mean(b[s]["reach"] for s in common) / statistics.mean(a[s]["reach"] for s in common)
        return Comparison(dataset, model, mode, e, len(common), statistics.mean(mo) - statistics.mean(ex), se, ratio)
    return None


def seeds_of(runs: Runs, c: Comparison) -> List[int]:
    """The seeds ``c`` was computed over."""
    both = set(runs[(c.dataset, c.model, "exact", c.epochs)]) & set(runs[(c.dataset, c.model, c.mode, c.epochs)])
    return sorted(both)[: c.seeds]


def informative(runs: Runs, dataset: str, model: str, epochs: int) -> bool:
    """Whether some run of the pair at ``epochs`` (any mode) learns past its first :data:`STILL` epochs."""
    return any(r["reach"] > STILL for (d, m, _, e), by_seed in runs.items() if (d, m, e) == (dataset, model, epochs)
               for r in by_seed.values())


@dataclass(frozen=True)
class Pair:
    """A dataset/model pair: ``refresh_every=0``, today's default where measured, and the options where it misses."""

    dataset: str
    model: str
    measured: Comparison
    today: Optional[Comparison]
    informative: bool
    options: List[Comparison]

    @property
    def name(self) -> str:
        """``GAT-4``."""
        return MODELS[self.model]


def pairs(runs: Runs) -> List[Pair]:
    """Every pair of the records, in the page's order (dataset, then model)."""
    out = []
    for d in DATASETS:
        for m in MODELS:
            c = compare(runs, d, m, MEASURED)
            if c is None:
                continue
            options = [] if c.within else [o for o in (compare(runs, d, m, mode, c.epochs) for mode in OPTIONS) if o]
            out.append(Pair(d, m, c, compare(runs, d, m, TODAY), informative(runs, d, m, c.epochs), options))
    return out


def gap_ratio(c: Comparison) -> str:
    """``+1.16, 1.38x``."""
    return f"{c.gap:+.2f}, {fmt_ratio(c.ratio)}"


def fix(p: Pair) -> str:
    """The options that bring ``p`` within the criterion, or the nearest of those measured."""
    good = [o for o in p.options if o.within]
    if good:
        return "; ".join(f"{OPTIONS[o.mode]} ({gap_ratio(o)})" for o in good)
    if not p.options:
        return "none measured"
    near = min(p.options, key=lambda o: o.excess)
    return f"none of {len(p.options)} (nearest {OPTIONS[near.mode]}: {gap_ratio(near)})"


def today_cell(ps: List[Pair]) -> str:
    """Today's default: pairs within the criterion of those measured, named (with epochs where they differ)."""
    done = [p for p in ps if p.today]
    if not done:
        return "–"
    names = ", ".join(p.name + ("" if p.today.epochs == p.measured.epochs else f" at {p.today.epochs} epochs")
                      for p in done)
    return f"{sum(p.today.within for p in done)} of {len(done)} ({names})"


def answer(records: List[dict]) -> List[str]:
    """The answer table: one row a dataset, then all pairs; counts add up to the pairs listed."""
    runs = index(records)
    every = pairs(runs)
    rows = []
    for d in DATASETS + [None]:
        ps = [p for p in every if d is None or p.dataset == d]
        if not ps:
            continue
        info = [p for p in ps if p.informative]
        still = [p for p in ps if not p.informative]
        out = [p for p in info if not p.measured.within]
        if d is None:
            n = f"{len(ps)} ({len(still)} not informative)" if still else str(len(ps))
            missed = str(len(out))
            fixes = f"{sum(any(o.within for o in p.options) for p in out)} of {len(out)}"
            same = [compare(runs, p.dataset, p.model, MEASURED, p.today.epochs, seeds_of(runs, p.today))
                    for p in ps if p.today]
            today = (f"{sum(p.today.within for p in ps if p.today)} of {len(same)} (`refresh_every=0` on the same "
                     f"seeds and epochs: {sum(c.within for c in same)} of {len(same)})") if same else "–"
        else:
            n = f"{len(ps)} ({', '.join(p.name for p in still)} not informative)" if still else str(len(ps))
            missed = "; ".join(f"{p.name} ({gap_ratio(p.measured)})" for p in out) or "none"
            fixes = "; ".join(f"{p.name}: {fix(p)}" for p in out) or "–"
            today = today_cell(ps)
        rows.append([d or "**all**", n, f"{len(info) - len(out)} of {len(info)}", missed, fixes, today])
    return markdown_table(["dataset", "pairs", "within the criterion, `refresh_every=0`",
                           "outside it: gap (points), epochs ratio", "option that brings it within",
                           "today's default: within, of pairs measured"], rows)


def verdict(c: Comparison, still: bool = False) -> str:
    """``within``, ``not informative`` or what misses: ``gap``, ``epochs``, or both."""
    if still:
        return "not informative"
    if c.within:
        return "within"
    return "outside: " + ", ".join(w for w, bad in (("gap", c.gap < GAP_FLOOR), ("epochs", c.ratio > RATIO_CAP))
                                   if bad)


def detail(records: List[dict], dataset: str) -> List[str]:
    """A dataset's pairs, one row a mode: ``refresh_every=0``, today's default (and ``refresh_every=0`` at its epochs
    and seeds where they differ), the options tried where ``refresh_every=0`` misses."""
    runs, rows = index(records), []
    for p in pairs(runs):
        if p.dataset != dataset:
            continue
        same = []  # refresh_every=0 at today's default's epochs and seeds, where these differ from its own
        if p.today and p.today.epochs != p.measured.epochs:
            same = [compare(runs, p.dataset, p.model, MEASURED, p.today.epochs, seeds_of(runs, p.today))]
        for c in [p.measured] + ([p.today] if p.today else []) + same + sorted(p.options, key=lambda o: o.excess):
            se = "" if c.se is None else f"{c.se:.2f}"
            rows.append([p.name, LABELS[c.mode], f"{c.epochs}, {c.seeds}", f"{c.gap:+.2f}", se, fmt_ratio(c.ratio),
                         verdict(c, c is p.measured and not p.informative)])
    return markdown_table(["model", "mode", "epochs, seeds", "gap (points)", "std error of gap", "epochs ratio",
                           "verdict"], rows, "lllrrrl")


def title(records: List[dict]) -> str:
    """The plot's title: the counts of the answer table's last row."""
    ps = [p for p in pairs(index(records)) if p.informative]
    done = [p for p in ps if p.today]
    return (f"{sum(p.measured.within for p in ps)} of {len(ps)} informative pairs within the criterion with "
            f"refresh_every=0 (gap \u2265 {GAP_FLOOR} points, \u2264 {RATIO_CAP}x the epochs);\ntoday's default (refresh "
            f"every epoch) within on {sum(p.today.within for p in done)} of the {len(done)} pairs it was measured on")


def plot(records: List[dict], path: Path = PLOT) -> None:
    """Gap to exact per informative pair, ``refresh_every=0`` and today's default, with std errors; an open marker
    where the pair needs more than 1.2x exact's epochs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ps = [p for p in pairs(index(records)) if p.informative]
    fig, ax = plt.subplots(figsize=(12, 4.8))
    ax.axhspan(-abs(GAP_FLOOR), abs(GAP_FLOOR), color=color("exact"), alpha=0.12, label="within 0.5 points of exact")
    ax.axhline(0, color=color("exact"), linewidth=0.8)
    series = [(MEASURED, "other", "refresh_every=0", -0.12), (TODAY, "gnnpipe", "today's default", 0.12)]
    for mode, key, label, dx in series:
        for slow in (False, True):
            pts = [(i + dx, c) for i, p in enumerate(ps) for c in [p.measured if mode == MEASURED else p.today]
                   if c is not None and (c.ratio > RATIO_CAP) == slow]
            if not pts:
                continue
            ax.errorbar([x for x, _ in pts], [c.gap for _, c in pts], yerr=[c.se or 0 for _, c in pts], fmt="o",
                        color=color(key), mfc="none" if slow else color(key), capsize=2, markersize=6,
                        label=f"{label}, {'over' if slow else 'at most'} 1.2x exact's epochs")
            for x, c in pts:
                p = ps[round(x - dx)]
                if mode == TODAY and c.epochs != p.measured.epochs:
                    ax.annotate(f"{c.epochs} epochs", (x, c.gap), textcoords="offset points", xytext=(-5, -3),
                                ha="right", fontsize=7, color=color(key))
    runs = index(records)
    other = [(i + 0.3, p.today.epochs, compare(runs, p.dataset, p.model, MEASURED, p.today.epochs,
                                               seeds_of(runs, p.today)))
             for i, p in enumerate(ps) if p.today and p.today.epochs != p.measured.epochs]
    if other:
        ax.errorbar([x for x, _, _ in other], [c.gap for _, _, c in other], yerr=[c.se or 0 for _, _, c in other],
                    fmt="s", color=color("other"), mfc="none", capsize=2, markersize=5,
                    label="refresh_every=0 at today's default's epochs and seeds")
        for x, e, c in other:
            ax.annotate(f"{e} epochs", (x, c.gap), textcoords="offset points", xytext=(5, -3), fontsize=7,
                        color=color("other"))
    ax.set_xticks(range(len(ps)), [f"{p.dataset} {p.name}" for p in ps], rotation=60, ha="right", fontsize=7)
    style_axes(ax, "dataset and model (bars: std error of the gap over seeds)", "test gap to exact (points)", title(records))
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def blocks(records: List[dict]) -> Dict[str, object]:
    """The page's generated blocks: name -> builder."""
    out = {"answer": partial(answer, records)}
    out.update({f"detail-{d}": partial(detail, records, d) for d in DATASETS})
    return out


def render(records: List[dict], text: str, page: Path = PAGE) -> str:
    """``text`` (the page) with every generated block replaced by the tables of ``records``.

    Raises:
        ValueError: A block's markers are missing.
    """
    return fill_blocks(text, blocks(records), str(page))


def write_page(records: Optional[List[dict]] = None, page: Path = PAGE, png: Path = PLOT) -> str:
    """Rewrite ``page``'s generated blocks from ``records`` (default: the benchmark's) and redraw the plot; return
    the page's path."""
    records = load() if records is None else records
    page.write_text(render(records, page.read_text(), page))
    plot(records, png)
    return str(page)


def check(records: Optional[List[dict]] = None, page: Path = PAGE) -> str:
    """The difference between ``page`` and what its records give (``""`` when equal)."""
    records = load() if records is None else records
    text = page.read_text()
    return differences(render(records, text, page), text, page.name)


if __name__ == "__main__":
    print(write_page())
