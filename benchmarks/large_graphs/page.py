"""``docs/large_graphs.md``'s tables and plot, written from ``benchmarks/large_graphs/runs.jsonl`` alone.

The page's prose is hand-written; each generated block sits between ``<!-- BEGIN name -->`` and ``<!-- END name -->``
and is replaced whole (:func:`write_page`), so a rerun of the benchmark rewrites the figures and nothing else.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Dict, List, Optional

from benchmarks.harness import memory
from benchmarks.harness.page import fill_blocks

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "large_graphs.md"
PLOT = ROOT / "docs" / "large_graphs.png"
GIB = memory.GIB
MIB = 2**20
MODES = {"hybrid": "hybrid 2 x 2 (`GNNPipeStrategy(graph_parallel_size=2)`)",
         "graph_parallel": "graph parallelism, G = 4 (`GraphParallelStrategy()`)"}


def gib(b: Optional[float]) -> str:
    return memory.gib(b) + ("" if b is None else " GiB")


def millions(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def latest(records: List[dict], **key) -> Optional[dict]:
    for rec in reversed(records):
        if all(rec.get(k) == v for k, v in key.items()):
            return rec
    return None


def largest_cluster_nodes(records: List[dict]) -> Optional[int]:
    done = [r["nodes"] for r in records if r["kind"] == "cluster" and r["exitcodes"] and not any(r["exitcodes"])]
    return max(done) if done else None


def single_outcome(rec: Optional[dict]) -> str:
    if rec is None:
        return "not run"
    if rec["exitcode"] == 0:
        return f"trains, machine peak {gib(rec['machine_peak_bytes'])}"
    killed = "OOM-killed" if rec["oom_kills"] else f"exit {rec['exitcode']}"
    return f"{killed} at {gib(rec['machine_peak_bytes'])}"


def answer(records: List[dict]) -> List[str]:
    """One row per cluster run at the largest size, and the single process's row at the size it trains."""
    n = largest_cluster_nodes(records)
    if n is None:
        return ["No cluster run is recorded yet."]
    graph = latest(records, kind="graph", nodes=n)
    rows = ["| graph | machines x cap | how | largest machine's peak | one CSR process under the same cap | "
            "partitioning (one machine) |", "|---|---|---|---|---|---|"]
    for mode in MODES:
        rec = latest(records, kind="cluster", nodes=n, mode=mode)
        if rec is None or any(rec["exitcodes"]):
            continue
        cap = rec["cap_bytes"]
        part = latest(records, kind="partition", nodes=n, G=2 if mode == "hybrid" else rec["machines"])
        single = latest(records, kind="single", nodes=n, cap_bytes=cap)
        rows.append(f"| {millions(n)} nodes, {millions(graph['edges'])} edges | {rec['machines']} x {gib(cap)} | "
                    f"{MODES[mode]} | {gib(max(rec['machine_peak_bytes']))} | {single_outcome(single)} | "
                    f"{part['wall_s']:.0f} s, peak {gib(part['peak_bytes'])} |")
    small = [r for r in records if r["kind"] == "single" and r["cap_bytes"] and r["exitcode"] == 0]
    if small:
        s = max(small, key=lambda r: r["nodes"])
        g = latest(records, kind="graph", nodes=s["nodes"])
        rows.append(f"| {millions(s['nodes'])} nodes, {millions(g['edges'])} edges | 1 x {gib(s['cap_bytes'])} | "
                    f"one CSR process | {gib(s['machine_peak_bytes'])} | (itself) | none |")
    return rows


def per_rank(records: List[dict]) -> List[str]:
    """Every rank's peak against the CSR single process's on the same graph (uncapped), and its partition's halo."""
    n = largest_cluster_nodes(records)
    ref = latest(records, kind="single", nodes=n, cap_bytes=None) if n else None
    if ref is None or not ref.get("peaks"):
        return ["The uncapped single process at this size is not recorded yet."]
    base = ref["peaks"]["uss"]
    rows = [f"Single CSR process, {millions(n)} nodes, uncapped: peak USS {gib(base)}, RSS "
            f"{gib(ref['peaks']['rss'])}, machine {gib(ref['machine_peak_bytes'])}.", "",
            "| how | rank | its partition: nodes + halo (halo / nodes) | peak USS | peak PSS | USS / single's | "
            "its machine's peak |", "|---|---|---|---|---|---|---|"]
    for mode in MODES:
        rec = latest(records, kind="cluster", nodes=n, mode=mode)
        if rec is None or any(rec["exitcodes"]):
            continue
        part = latest(records, kind="partition", nodes=n, G=2 if mode == "hybrid" else rec["machines"])
        G = part["G"]
        for r, peaks in enumerate(rec["rank_peaks"]):
            S = rec["machines"] // G
            g = r // S if mode == "hybrid" else r  # hybrid rank r: stage r % S of partition r // S (its pipeline)
            p = part["parts"][g]
            where = f"stage {r % S}, partition {g}" if mode == "hybrid" else f"partition {g}"
            rows.append(f"| {mode.replace('_', ' ')} | {r} ({where}) | {p['nodes']:,} + {p['halo']:,} "
                        f"({p['halo'] / p['nodes']:.2f}) | {gib(peaks['uss'])} | {gib(peaks.get('pss'))} | "
                        f"{peaks['uss'] / base:.2f}x | {gib(rec['machine_peak_bytes'][r])} |")
    idle = latest(records, kind="idle")
    agents = [a for r in records if r["kind"] == "cluster" and r["nodes"] == n for a in r["agents"] if a]
    if idle and agents:
        worst = max(agents, key=lambda a: a["uss"])
        rows += ["", f"torchrun agents: USS at most {worst['uss'] / MIB:,.0f} MiB, RSS {worst['rss'] / MIB:,.0f} MiB; "
                     f"an idle Python with torch imported: USS {idle['uss'] / MIB:,.0f} MiB, RSS "
                     f"{idle['rss'] / MIB:,.0f} MiB."]
    return rows


def estimate(records: List[dict]) -> List[str]:
    """Each rank's peak USS at the middle size, predicted by a straight line in ``|V|`` through its peaks at the
    smallest size (Python, torch, Lightning and PyG, nearly no graph) and the largest, against the measured."""
    rows = ["| how | rank | smallest run | largest run | predicted at the middle size | measured | error |",
            "|---|---|---|---|---|---|---|"]
    for mode in MODES:
        runs = sorted((r for r in records if r["kind"] == "cluster" and r["mode"] == mode and not any(r["exitcodes"])),
                      key=lambda r: r["nodes"])
        by_size = {r["nodes"]: r for r in runs}
        sizes = sorted(by_size)
        if len(sizes) < 3:
            continue
        lo, mid, hi = by_size[sizes[0]], by_size[sizes[len(sizes) // 2]], by_size[sizes[-1]]
        for r in range(lo["machines"]):
            a, m, b = (run["rank_peaks"][r]["uss"] for run in (lo, mid, hi))
            pred = a + (b - a) * (mid["nodes"] - lo["nodes"]) / (hi["nodes"] - lo["nodes"])
            rows.append(f"| {mode.replace('_', ' ')} | {r} | {gib(a)} ({millions(lo['nodes'])}) | {gib(b)} "
                        f"({millions(hi['nodes'])}) | {gib(pred)} ({millions(mid['nodes'])}) | {gib(m)} | "
                        f"{(pred - m) / m:+.0%} |")
    return rows


def accuracy(records: List[dict]) -> List[str]:
    """Validation accuracy after the first, middle and last epoch, test accuracy at the last, seconds an epoch."""
    n = largest_cluster_nodes(records)
    runs = {"one CSR process (uncapped)": latest(records, kind="single", nodes=n, cap_bytes=None)}
    for mode in MODES:
        runs[MODES[mode].split(" (")[0]] = latest(records, kind="cluster", nodes=n, mode=mode)
    rows = None
    for name, rec in runs.items():
        epochs = (rec or {}).get("epochs_rows") or []
        if not epochs:
            continue
        picks = sorted({0, len(epochs) // 2 - 1, len(epochs) - 1})
        if rows is None:
            rows = ["| run | " + " | ".join(f"validation, epoch {e + 1}" for e in picks) + " | test, epoch "
                    f"{len(epochs)} | training s an epoch | validation s an epoch |", "|---" * (len(picks) + 4) + "|"]
        train = sorted(e["train_s"] for e in epochs)[len(epochs) // 2]
        val = sorted(e["val_s"] for e in epochs)[len(epochs) // 2]
        rows.append(f"| {name} | " + " | ".join(f"{epochs[e]['val_acc']:.4f}" for e in picks) +
                    f" | {epochs[-1]['test_acc']:.4f} | {train:.0f} | {val:.0f} |")
    return rows or ["No run with accuracy is recorded yet."]


def partitioning(records: List[dict]) -> List[str]:
    rows = ["| nodes | edges | G x K | wall s | METIS and plan s | peak | per million edges | edge cut (chunks) | "
            "edge cut (partitions) | directory |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted((r for r in records if r["kind"] == "partition" and r["nodes"] >= 100_000),
                    key=lambda r: (r["nodes"], r["G"])):
        rows.append(f"| {millions(r['nodes'])} | {millions(r['num_edges'])} | {r['G']} x {r['K'] // r['G']} | "
                    f"{r['wall_s']:.0f} | {r['seconds']['metis_and_plan']:.0f} | {gib(r['peak_bytes'])} | "
                    f"{r['peak_bytes_per_million_edges'] / MIB:,.0f} MiB | {r['edge_cut']:.4f} | "
                    f"{r['partition_edge_cut']:.4f} | {gib(r['bytes'])} |")
    rows += ["", "| partitioner | nodes | parts | seconds (of which partitioning) | peak over the loaded graph | "
             "edge cut | largest part / mean |", "|---|---|---|---|---|---|---|"]
    for r in sorted((r for r in records if r["kind"] == "partitioner"), key=lambda r: (r["nodes"], r["parts"],
                                                                                      r["method"])):
        rows.append(f"| {r['method']} | {millions(r['nodes'])} | {r['parts']} | {r['total_s']:.1f} "
                    f"({r['partition_s']:.1f}) | {gib(r['peak_over_graph_bytes'])} | {r['edge_cut']:.4f} | "
                    f"{r['balance']:.3f} |")
    return rows


def plot(records: List[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = largest_cluster_nodes(records)
    if n is None:
        return
    bars: Dict[str, float] = {}
    cap = None
    for mode in MODES:
        rec = latest(records, kind="cluster", nodes=n, mode=mode)
        if rec and not any(rec["exitcodes"]):
            cap = rec["cap_bytes"]
            for r, b in enumerate(rec["machine_peak_bytes"]):
                bars[f"{'hybrid' if mode == 'hybrid' else 'graph par.'}\nmachine {r}"] = b / GIB
    ref = latest(records, kind="single", nodes=n, cap_bytes=None)
    if ref:
        bars["one process\n(uncapped)"] = ref["machine_peak_bytes"] / GIB
    fig, ax = plt.subplots(figsize=(9, 3.6))
    colours = ["#4C72B0"] * 4 + ["#55A868"] * 4 + ["#C44E52"]
    ax.bar(range(len(bars)), list(bars.values()), color=colours[:len(bars)])
    ax.set_xticks(range(len(bars)), list(bars.keys()), fontsize=7)
    if cap:
        ax.axhline(cap / GIB, color="black", linestyle="--", linewidth=1)
        ax.text(len(bars) - 0.5, cap / GIB, f" cap {cap / GIB:.0f} GiB", va="bottom", ha="right", fontsize=8)
    ax.set_ylabel("machine's peak memory (GiB)")
    ax.set_title(f"{millions(n)} nodes: 4 machines capped at {cap / GIB:.0f} GiB train it; one process needs "
                 f"{bars.get('one process' + chr(10) + '(uncapped)', 0):.1f} GiB", fontsize=9)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    plt.close(fig)


BLOCKS = {"answer": answer, "per_rank": per_rank, "estimate": estimate, "accuracy": accuracy,
          "partitioning": partitioning}


def render(records: List[dict], text: str, page: Path = PAGE) -> str:
    """``text`` (the page) with every generated block replaced by the tables of ``records``.

    Raises:
        ValueError: A block's markers are missing.
    """
    return fill_blocks(text, {name: partial(build, records) for name, build in BLOCKS.items()}, str(page))


def write_page(records: List[dict], page: Path = PAGE) -> str:
    """Replace every generated block of ``page`` with the tables of ``records``; redraw the plot; return the path."""
    page.write_text(render(records, page.read_text(), page))
    plot(records)
    return str(page)
