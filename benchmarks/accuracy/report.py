"""The accuracy benchmark's report: per-mode summaries over seeds, the markdown tables of
``docs/results/notes/accuracy.md`` (its generated blocks) and the validation-curve PNG, from finished runs alone.
"""

from __future__ import annotations

import os
import statistics
import sys
import textwrap
from typing import Dict, List, Optional, Tuple

from benchmarks.accuracy.matrix import PLOT, STUDY_MODES, TABLE_MODES, plan_jobs


def summarise(args, runs, dataset: str, model_name: str, mode: str, seeds: List[int],
              epochs: Optional[int] = None) -> Dict[str, object]:
    """Return mean/std test metric (%), mean and median epochs to 99% best val and mean seconds over ``seeds``."""
    epochs = epochs or args.epochs_of(dataset)
    rs = [runs[(dataset, model_name, mode, s, epochs, args.lr, args.weight_decay)] for s in seeds]
    tests = [100 * r["test"] for r in rs]
    return {"dataset": dataset, "model": model_name, "mode": mode, "epochs": epochs, "tests": tests,
            "mean": statistics.mean(tests), "std": statistics.pstdev(tests),
            "reach": statistics.mean(r["reach"] for r in rs),
            "reach_median": statistics.median(r["reach"] for r in rs),
            "seconds": statistics.mean(r["seconds"] for r in rs)}


def reach_exact_target(args, runs, dataset: str, model_name: str, mode: str, seeds: List[int],
                       epochs: Optional[int] = None) -> Tuple[Optional[float], int]:
    """Return the median epochs for ``mode`` to reach 99% of exact's best validation metric of the same seed.

    A common target for both modes: unlike ``epochs to 99% best val``, a run that ends with a higher best of its
    own is not penalised for it. Returns ``(median, never)``, ``never`` the number of seeds whose run does not reach
    the target in its epochs (counted as infinitely slow in the median; ``None`` when more than half never do).
    """
    epochs = epochs or args.epochs_of(dataset)
    found = []
    for s in seeds:
        target = 0.99 * max(runs[(dataset, model_name, "exact", s, epochs, args.lr, args.weight_decay)]["val"])
        val = runs[(dataset, model_name, mode, s, epochs, args.lr, args.weight_decay)]["val"]
        found.append(next((i + 1 for i, v in enumerate(val) if v >= target), float("inf")))
    median = statistics.median(found)
    return (None if median == float("inf") else median), sum(f == float("inf") for f in found)


def table(rows: List[Dict[str, object]]) -> List[str]:
    """Return markdown table lines with the gap (points) and epochs ratio of each row to its exact row.

    The standard error of the gap is that of the mean of the per-seed differences (same seed: same initial
    weights in both modes), ``stdev(diffs) / sqrt(seeds)``.
    """
    exact = {(r["dataset"], r["model"]): r for r in rows if r["mode"] == "exact"}
    lines = ["| dataset | model | epochs | mode | test metric (%) | gap to exact (points) | std error of gap "
             "| epochs to 99% best val | median epochs | ratio to exact | s/run |", "|---" * 11 + "|"]
    for r in rows:
        ref = exact.get((r["dataset"], r["model"]))
        other = ref is not None and r is not ref
        gap = f"{r['mean'] - ref['mean']:+.2f}" if other else ""
        diffs = [a - b for a, b in zip(r["tests"], ref["tests"])] if other else []
        se = f"{statistics.stdev(diffs) / len(diffs) ** 0.5:.2f}" if len(diffs) > 1 else ""
        ratio = f"{r['reach'] / ref['reach']:.2f}" if other else ""
        lines.append(f"| {r['dataset']} | {r['model']} | {r['epochs']} | {r['mode']} | {r['mean']:.2f} ± "
                     f"{r['std']:.2f} | {gap} | {se} | {r['reach']:.1f} | {r['reach_median']:g} | {ratio} | "
                     f"{r['seconds']:.0f} |")
    return lines


def study_averages(rows: List[Dict[str, object]]) -> List[str]:
    """Return markdown lines averaging, per technique mode, the gap and epochs ratio to exact over the pairs."""
    exact = {(r["dataset"], r["model"]): r for r in rows if r["mode"] == "exact"}
    lines = ["| mode | mean gap to exact (points) | worst gap (points) | mean epochs ratio | worst epochs ratio |",
             "|---|---|---|---|---|"]
    for mode in STUDY_MODES[1:]:
        sel = [r for r in rows if r["mode"] == mode]
        gaps = [r["mean"] - exact[(r["dataset"], r["model"])]["mean"] for r in sel]
        ratios = [r["reach"] / exact[(r["dataset"], r["model"])]["reach"] for r in sel]
        lines.append(f"| {mode} | {statistics.mean(gaps):+.2f} | {min(gaps):+.2f} | {statistics.mean(ratios):.2f} | "
                     f"{max(ratios):.2f} |")
    return lines


def command_block(args, runs) -> List[str]:
    """Return the markdown lines with the regenerating command and the cost of a run from scratch."""
    hours = sum(r["seconds"] for r in runs.values()) / 3600
    return ["```bash", "python -m benchmarks.accuracy.run " + " ".join(sys.argv[1:]), "```", ""] + textwrap.wrap(
            f"It reads the {len(runs)} runs it needs from `benchmarks/accuracy/runs.jsonl` (seconds). On a "
            f"fresh machine, or with `--no-cache`, it computes them: {hours:.1f} hours of one CPU core "
            "(`--threads 1`), the sum of the seconds measured for each run and stored in the cache (measured on a "
            "shared, loaded machine: an idle one needs less).", 116, break_on_hyphens=False)


def replace_block(text: str, name: str, lines: List[str]) -> str:
    """Replace the lines between ``<!-- begin NAME -->`` and ``<!-- end NAME -->`` (append the block if absent)."""
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    block = "\n".join([begin] + lines + [end])
    if begin in text and end in text:
        return text[: text.index(begin)] + block + text[text.index(end) + len(end):]
    return text.rstrip("\n") + "\n\n" + block + "\n"


def write_report(args, runs) -> None:
    """Refresh the generated blocks of ``<out>/accuracy.md`` (prose around them is kept) and write the PNG."""
    os.makedirs(args.out, exist_ok=True)
    rows = {"table": [], "study": [], "seeds": [], "seeds20": [], "longer": [], "techniques": []}
    for section, d, m, modes, seeds, epochs in plan_jobs(args):
        rows[section] += [summarise(args, runs, d, m, mode, seeds, epochs) for mode in modes]
    path = os.path.join(args.out, "accuracy.md")
    text = open(path).read() if os.path.exists(path) else "# Accuracy: GNNPipe against exact full-graph training\n"
    text = replace_block(text, "command", command_block(args, runs))
    text = replace_block(text, "table", table(rows["table"]))
    if rows["study"]:
        text = replace_block(text, "study", table(rows["study"]) + [""] + study_averages(rows["study"]))
    for name in ("seeds", "seeds20", "longer", "techniques"):
        if rows[name]:
            text = replace_block(text, name, table(rows[name]))
    with open(path, "w") as f:
        f.write(text)
    plot(args, runs)


def plot(args, runs) -> None:
    """Write ``<out>/accuracy_curves.png``: validation curves of seed 0 per table mode for the PLOT pairs."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG written (pip install matplotlib)")
        return
    key = lambda d, m, mode: (d, m, mode, args.seeds[0], args.epochs_of(d), args.lr, args.weight_decay)  # noqa: E731
    pairs = [(d, m) for d, m in PLOT if all(key(d, m, mode) in runs for mode in TABLE_MODES)]
    if not pairs:
        return
    fig, axes = plt.subplots(1, len(pairs), figsize=(6 * len(pairs), 4), squeeze=False)
    for ax, (dataset, model_name) in zip(axes[0], pairs):
        for mode in TABLE_MODES:
            curve = runs[key(dataset, model_name, mode)]["val"]
            ax.plot(range(1, len(curve) + 1), curve, label=mode)
        ax.set_title(f"{dataset}, {model_name}, seed {args.seeds[0]}")
        ax.set_xlabel("epoch")
        ax.set_ylabel("validation metric")
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "accuracy_curves.png"), dpi=100)
