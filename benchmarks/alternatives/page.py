"""Write ``docs/results/alternatives.md`` and its plot from the alternatives benchmark's records alone.

Time to accuracy: a run reaches 99% of the exact single process's best validation accuracy (same graph, model and
seed) at the first epoch whose validation accuracy is at least that; its seconds are the training and validation
seconds of its epochs up to there (setup, METIS included, is reported apart). Best test accuracy: at the epoch of the
run's best validation accuracy (what ``EarlyStopping`` with a checkpoint of the best epoch keeps); final: its last
epoch's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Tuple

from benchmarks.harness.page import color, markdown_table

GIB = 2**30
LABELS = {"exact": "exact full-graph, 1 process", "gnnpipe": "`GNNPipeStrategy()`, one step an epoch",
          "gnnpipe_steps": "GNNPipe, several steps an epoch", "cluster_gcn": "Cluster-GCN, 1 process",
          "cluster_gcn_coarse": "Cluster-GCN, 300 clusters, 1 process",
          "neighbor_ddp": "NeighborLoader + DDP, 2 processes"}
SHORT = {"exact": "exact", "gnnpipe": "GNNPipe", "gnnpipe_steps": "GNNPipe steps", "cluster_gcn": "Cluster-GCN",
         "cluster_gcn_coarse": "Cluster-GCN 300",
         "neighbor_ddp": "NeighborLoader DDP"}
MODEL_NAMES = {"ressage8": "GraphSAGE-8", "gcnii16": "GCNII-16"}
COMMAND = "python -m benchmarks.alternatives.bench"


def stopped(rec: dict) -> str:
    """Why the run ended (replayed from its epochs: records of the strategy's spawned fits could not read it)."""
    from benchmarks.alternatives.worker import stop_reason

    return stop_reason(rec["spec"], rec["epochs"])


def size_name(nodes: int) -> str:
    """``300000`` -> ``"300k"``, ``1000000`` -> ``"1M"``."""
    return f"{nodes // 10**6}M" if nodes % 10**6 == 0 else f"{nodes // 1000:,}k"


def method_of(spec: dict) -> str:
    """The page's name of a run's method (``gnnpipe_steps``: GNNPipe with ``chunks_per_step``)."""
    if spec["method"] == "gnnpipe" and spec.get("chunks_per_step") is not None:
        return "gnnpipe_steps"
    if spec["method"] == "cluster_gcn" and spec.get("cluster_parts") is not None:
        return "cluster_gcn_coarse"
    return spec["method"]


def steps_name(spec: dict) -> str:
    return f"K = {spec['chunks']}, {spec['chunks_per_step']} a step, {spec['chunk_groups']}"


def elapsed(rec: dict) -> List[float]:
    """Cumulative training + validation seconds at the end of every epoch."""
    out, total = [], 0.0
    for row in rec["epochs"]:
        total += row["train_s"] + row["val_s"]
        out.append(total)
    return out


def best_val(rec: dict) -> float:
    return max(row["val_acc"] for row in rec["epochs"])


def to_target(rec: dict, target: float) -> Optional[Tuple[int, float]]:
    """``(epochs, seconds)`` to the first validation accuracy >= ``target``, or ``None``."""
    for i, (row, seconds) in enumerate(zip(rec["epochs"], elapsed(rec))):
        if row["val_acc"] >= target:
            return i + 1, seconds
    return None


def test_accuracies(rec: dict) -> Tuple[float, float]:
    """``(test accuracy at the best validation epoch, at the last epoch)``."""
    rows = rec["epochs"]
    best = max(range(len(rows)), key=lambda i: (rows[i]["val_acc"], -i))
    return rows[best]["test_acc"], rows[-1]["test_acc"]


def peak_uss(rec: dict) -> Tuple[float, int]:
    """``(largest process's peak USS in GiB, processes)`` (the launcher counted for the single-process methods)."""
    procs = rec.get("processes", {})
    ranks = {k: v for k, v in procs.items() if k.startswith("rank")}
    used = ranks or procs
    return max((v["uss"] for v in used.values()), default=0) / GIB, max(len(ranks), 1)


def accuracy_runs(records: List[dict]) -> Dict[Tuple[int, str], Dict[str, dict]]:
    """The early-stopped free-link runs, by (nodes, model), then method (the accuracy part's :data:`STEPS` for
    ``gnnpipe_steps``; tuning variants apart)."""
    from benchmarks.alternatives.bench import STEPS

    out: Dict[Tuple[int, str], Dict[str, dict]] = {}
    for rec in records:
        s = rec["spec"]
        if rec["status"] != "ok" or s.get("epochs") is not None or s["rate_bits"] is not None or s["seed"] != 0:
            continue
        method = method_of(s)
        if method == "gnnpipe_steps" and {k: s[k] for k in STEPS} != STEPS:
            continue
        out.setdefault((s["graph"]["num_nodes"], s["model"]), {})[method] = rec
    return out


def _fmt_time(hit: Optional[Tuple[int, float]], budget: bool = False) -> str:
    if hit is None:
        return "not reached" + (" (budget)" if budget else "")
    return f"{hit[1]:,.0f} s ({hit[0]} ep.)"


def answer_table(runs: Dict[Tuple[int, str], Dict[str, dict]]) -> List[str]:
    """Methods as rows, (nodes, model) as columns: seconds to 99% of exact's best validation accuracy."""
    from benchmarks.alternatives.bench import METHODS

    keys = sorted(runs, key=lambda k: (k[0], k[1] != "ressage8"))
    rows = []
    for method in METHODS:
        cells = [SHORT[method]]
        for key in keys:
            rec, exact = runs[key].get(method), runs[key].get("exact")
            if rec is None or exact is None:
                cells.append("not run")
                continue
            hit = to_target(rec, 0.99 * best_val(exact))
            best, _ = test_accuracies(rec)
            cells.append(f"{_fmt_time(hit, stopped(rec) == 'budget')}, test {best:.3f}")
        rows.append(cells)
    return markdown_table(["method"] + [f"{size_name(n)}, {MODEL_NAMES[m]}" for n, m in keys], rows)


def detail_table(key: Tuple[int, str], runs: Dict[str, dict]) -> List[str]:
    from benchmarks.alternatives.bench import METHODS

    exact = runs.get("exact")
    target = 0.99 * best_val(exact) if exact is not None else None
    lines = [f"| method | s / epoch | steps / epoch | to 99% ({target:.4f}) | best val | test at best val | final test "
             f"| epochs, why stopped | peak USS / process | setup s |" if target is not None else "",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for method in METHODS:
        rec = runs.get(method)
        if rec is None:
            continue
        rows = rec["epochs"]
        per_epoch = sorted(r["train_s"] + r["val_s"] for r in rows)[len(rows) // 2]
        best, final = test_accuracies(rec)
        uss, procs = peak_uss(rec)
        name = SHORT[method] + (f" ({steps_name(rec['spec'])})" if method == "gnnpipe_steps" else "")
        lines.append(f"| {name} | {per_epoch:.1f} | {rows[0].get('steps', 1)} | "
                     f"{_fmt_time(to_target(rec, target) if target else None, stopped(rec) == 'budget')} | "
                     f"{best_val(rec):.4f} | {best:.4f} | {final:.4f} | {len(rows)}, {stopped(rec)} | "
                     f"{uss:.2f} GiB x {procs} | {rec.get('setup_s', 0):.0f} |")
    return lines


def tuning_table(records: List[dict]) -> List[str]:
    """The tuning part's runs beside exact's: s to 99%, best test accuracy."""
    runs = accuracy_runs(records)
    lines = ["| nodes | model | setting | s / epoch | to 99% of exact's best val | best val | test at best val |",
             "|---|---|---|---|---|---|---|"]
    for rec in sorted((r for r in records if r["status"] == "ok" and method_of(r["spec"]) == "gnnpipe_steps"
                       and r["spec"].get("epochs") is None and r["spec"]["rate_bits"] is None),
                      key=lambda r: (r["spec"]["graph"]["num_nodes"], r["spec"]["model"] != "ressage8",
                                     r["spec"]["chunks"], r["spec"]["chunks_per_step"], r["spec"]["chunk_groups"])):
        s = rec["spec"]
        exact = runs.get((s["graph"]["num_nodes"], s["model"]), {}).get("exact")
        if exact is None:
            continue
        rows = rec["epochs"]
        per_epoch = sorted(r["train_s"] + r["val_s"] for r in rows)[len(rows) // 2]
        ended = " (budget)" if stopped(rec) == "budget" else ""
        lines.append(f"| {size_name(s['graph']['num_nodes'])} | {MODEL_NAMES[s['model']]} | {steps_name(s)} | "
                     f"{per_epoch:.1f} | {_fmt_time(to_target(rec, 0.99 * best_val(exact)))} | "
                     f"{best_val(rec):.4f}{ended} | {test_accuracies(rec)[0]:.4f} |")
    return lines


def link_table(records: List[dict], runs: Dict[Tuple[int, str], Dict[str, dict]]) -> List[str]:
    """Short runs of the multi-process methods, free and shaped: the last epoch's seconds, and time to 99% at the
    shaped rate (the free-link run's epochs at the shaped epoch's seconds)."""
    timed: Dict[Tuple[str, str, Optional[float]], dict] = {}
    for rec in records:
        s = rec["spec"]
        if rec["status"] == "ok" and s.get("epochs") in (1, 2) and s["graph"]["num_nodes"] == 300_000:
            timed[(s["model"], method_of(s), s["rate_bits"])] = rec
    rates = sorted({k[2] for k in timed if k[2] is not None})
    if not rates:
        return []
    rate = rates[-1]
    lines = [f"| model | method | epoch s, free link | epoch s at {rate / 1e6:.0f} Mbit/s | to 99% at "
             f"{rate / 1e6:.0f} Mbit/s |", "|---|---|---|---|---|"]
    for model in ("ressage8", "gcnii16"):
        free_runs = runs.get((300_000, model), {})
        exact = free_runs.get("exact")
        for method in ("exact", "cluster_gcn", "cluster_gcn_coarse", "gnnpipe", "gnnpipe_steps", "neighbor_ddp"):
            if method in ("exact", "cluster_gcn", "cluster_gcn_coarse"):
                rec = free_runs.get(method)
                if rec is None or exact is None:
                    continue
                hit = to_target(rec, 0.99 * best_val(exact))
                lines.append(f"| {MODEL_NAMES[model]} | {SHORT[method]} (1 process: no link) | | | "
                             f"{_fmt_time(hit)} |")
                continue
            free, shaped = timed.get((model, method, None)), timed.get((model, method, rate))
            if free is None or shaped is None:
                continue
            f_s = free["epochs"][-1]["train_s"] + free["epochs"][-1]["val_s"]
            r_s = shaped["epochs"][-1]["train_s"] + shaped["epochs"][-1]["val_s"]
            long = free_runs.get(method)
            hit = to_target(long, 0.99 * best_val(exact)) if long is not None and exact is not None else None
            cell = "not reached" if hit is None else f"{hit[0] * r_s:,.0f} s ({hit[0]} ep.)"
            lines.append(f"| {MODEL_NAMES[model]} | {SHORT[method]} | {f_s:.1f} | {r_s:.1f} | {cell} |")
    return lines


def plot(runs: Dict[Tuple[int, str], Dict[str, dict]], path: Path, title: str) -> None:
    """Validation accuracy against wall seconds, a panel per (nodes, model), a line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(runs, key=lambda k: (k[0], k[1] != "ressage8"))
    cols = min(3, len(keys))
    rows_n = -(-len(keys) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(5.5 * cols, 4.6 * rows_n), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        exact = runs[key].get("exact")
        for method, rec in runs[key].items():
            xs = elapsed(rec)
            ax.plot(xs, [r["val_acc"] for r in rec["epochs"]], color=color(method), label=SHORT[method],
                    marker="." if len(xs) < 30 else None)
        if exact is not None:
            ax.axhline(0.99 * best_val(exact), color="#999999", linestyle="--", linewidth=1,
                       label="99% of exact's best")
        ax.set_title(f"{size_name(key[0])} nodes, {MODEL_NAMES[key[1]]}")
        ax.set_xlabel("training + validation seconds (wall)")
        ax.set_ylabel("validation accuracy")
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(keys):]:
        ax.remove()
    legend: Dict[str, object] = {}  # every panel's methods, once each
    for ax in axes.flat[:len(keys)]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=len(legend), frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fastest(runs: Dict[str, dict]) -> Optional[str]:
    """The method that reached 99% of exact's best validation accuracy in the fewest seconds (``None``: none did)."""
    exact = runs.get("exact")
    if exact is None:
        return None
    hits = {m: to_target(rec, 0.99 * best_val(exact)) for m, rec in runs.items()}
    hits = {m: h[1] for m, h in hits.items() if h is not None}
    return min(hits, key=hits.get) if hits else None


def plot_title(runs: Dict[Tuple[int, str], Dict[str, dict]]) -> str:
    """The plot's conclusion: which method reached 99% of exact's best validation accuracy first, in how many of the
    settings."""
    wins: Dict[str, int] = {}
    for key in runs:
        m = fastest(runs[key])
        if m is not None:
            wins[m] = wins.get(m, 0) + 1
    if not wins:
        return "Validation accuracy against wall seconds"
    ranked = sorted(wins.items(), key=lambda kv: -kv[1])
    return "First to 99% of exact's best validation accuracy: " + ", ".join(
        f"{SHORT[m]} in {n} of {len(runs)} settings" for m, n in ranked)


def write_page(records: List[dict], path: Path, sections: Optional[Dict[str, str]] = None) -> None:
    """Write the page (and ``alternatives.png`` beside it) from ``records``; ``sections``: the hand-written text
    between the generated tables (key -> markdown), read from the page's previous version's marked blocks when
    ``None``."""
    runs = accuracy_runs(records)
    page = render(records, sections if sections is not None else read_sections(path), path)
    if runs:
        plot(runs, path.with_suffix(".png"), plot_title(runs))
    path.write_text(page)


def render(records: List[dict], text: Dict[str, str], path: Path) -> str:
    """The page's markdown from ``records`` and the hand-written ``text`` blocks (:func:`read_sections`)."""
    runs = accuracy_runs(records)
    png = path.with_suffix(".png")
    title = plot_title(runs)
    out = ["# GNNPipe against Cluster-GCN and neighbour sampling", "",
           "<!-- written by " + COMMAND + " from benchmarks/alternatives/runs.jsonl; edit the text between the "
           "BEGIN/END markers only -->", ""]
    out += block(text, "answer")
    out += ["Seconds to 99% of the exact single process's best validation accuracy (epochs). Test accuracy: at the "
            "best validation epoch. 2-core CPU host, free link:", ""]
    out += answer_table(runs) + [""]
    out += [f"![{title}]({png.name})", ""]
    out += ["## Where each method wins, and why", ""] + block(text, "why")
    out += block(text, "setup")
    out += ["## Each run", ""]
    for key in sorted(runs, key=lambda k: (k[0], k[1] != "ressage8")):
        out += [f"### {key[0]:,} nodes, {MODEL_NAMES[key[1]]}", ""] + detail_table(key, runs[key]) + [""]
    out += ["## Over a cluster link", ""] + block(text, "link") + link_table(records, runs) + [""]
    out += ["## Choosing the steps", ""] + block(text, "tuning") + tuning_table(records) + [""]
    return "\n".join(out).rstrip() + "\n"


def block(text: Dict[str, str], name: str) -> List[str]:
    return [f"<!-- BEGIN {name} -->", text.get(name, "").strip(), f"<!-- END {name} -->", ""]


def read_sections(path: Path) -> Dict[str, str]:
    """The hand-written blocks (``<!-- BEGIN name -->`` ... ``<!-- END name -->``) of the page as it is, and the plot's
    title (a block of its own)."""
    if not path.exists():
        return {}
    lines, out, name, buf = path.read_text().splitlines(), {}, None, []
    for line in lines:
        if line.startswith("<!-- BEGIN ") and line.endswith(" -->"):
            name, buf = line[len("<!-- BEGIN "):-4], []
        elif name is not None and line == f"<!-- END {name} -->":
            out[name], name = "\n".join(buf), None
        elif name is not None:
            buf.append(line)
    return out
