"""``docs/results/time_to_accuracy.md`` from the cached records of ``bench.py`` (nothing is measured here).

Derived figures, per (graph, model, seed):

* target: 99% of the exact single process's best validation accuracy over its epochs;
* epochs to it: the first epoch (counted from 1) whose validation accuracy reaches the target;
* seconds to it: the training and validation seconds of those epochs, as measured in the run;
* test accuracy at the run's best validation epoch (the first such epoch on ties);
* train / validation seconds per epoch: medians over the epochs after the first; bytes: sent by all ranks in one
  training step (median); peak memory of the largest process (RSS, and USS).

Under an emulated link the numerics do not change (the same processes compute the same values; only their transfers
are slower), so the time to accuracy at rate ``R`` is the free-link run's epochs to the target times the epoch
(training and validation) measured at ``R``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from benchmarks.harness.memory import GIB
from benchmarks.time_to_accuracy.accuracy import accuracy_rows, accuracy_sentences, accuracy_summary, pair_epochs
from benchmarks.time_to_accuracy.findings import FINDINGS
from benchmarks.time_to_accuracy.link_tables import (LINK_SESSION, link_runs, link_table, rate_lines, spread_lines,
                                                     time_split)
from benchmarks.time_to_accuracy.prose import PAIRS_INTRO, SETUP, SINCE
from benchmarks.time_to_accuracy.run_records import (EXACT_FORWARD, GRAPHS, LABEL_EXACT_FORWARD, SHORT,
                                                     default_modes, mode_key, ok, timed)

__all__ = ["write_page", "answer", "targets", "bytes_bound",
           # moved to the modules above; imported from here by bench.py and planner.py
           "EXACT_FORWARD", "LINK_SESSION", "link_runs", "ok", "timed"]


def write_page(records: List[dict], path: Path, planner: Optional[Dict[tuple, dict]] = None,
               spread: Optional[List[dict]] = None, spread_planner: Optional[Dict[tuple, dict]] = None,
               planner_lines: Sequence[str] = (), pairs: Sequence[dict] = ()) -> None:
    """The page from the records of its own graph, and of the spread graph (``spread``); ``planner_lines``: the
    planner's account (:func:`benchmarks.time_to_accuracy.planner.planner_paragraph`), after the findings;
    ``pairs``: the alternating pairs' runs (:mod:`benchmarks.time_to_accuracy.pairs`)."""
    from benchmarks.time_to_accuracy.pairs import pair_lines
    from benchmarks.time_to_accuracy.rates import GPU_LINKS_GBIT, HBM_BYTES_PER_S, HBM_EFFICIENCY, derived_rates

    rates = derived_rates(records)
    acc_lines, derived = accuracy_rows(records)
    link_lines, summary = link_table(records, derived, rates, planner or {})
    spread_section, spread_summary, spread_derived = spread_lines(spread or [], rates, spread_planner or {})
    out = ["# Time to accuracy on learnable 300k- and 1M-node graphs, over an emulated cluster link", ""]
    out += answer(derived, summary + spread_summary, rates)
    out += ["Targets, GNNPipe's defaults (and, last, its option for deep models; seconds from each mode's latest "
            "quiet run, at 300k the latest session's; over all of the runs of the session before it, the first table's "
            "medians, GCNII-16's time to 99% is 0.70x and 0.68x at 300k and 0.71x at 1M):", "",
            *targets(derived, summary + spread_summary, spread_derived), ""]
    out += [bytes_bound(summary + spread_summary), ""]
    spread_acc = accuracy_sentences(spread_derived, defaults_only=True)
    if spread_acc:
        out += ["Accuracy on the spread graph ([below](#a-graph-whose-long-range-edges-touch-every-node)): "
                + "; ".join(spread_acc) + ".", ""]
    out += ["## Setup", "", *SETUP, ""]
    out += ["## The current code against the single process", "", *SINCE, ""]
    if pairs:
        out += ["### Alternating pairs, a later session", "", PAIRS_INTRO, "",
                *pair_lines(pairs, pair_epochs(derived), pair_epochs(spread_derived)), ""]
    out += ["## Over a link", "", *link_lines, ""]
    out += ["### Where the time goes", "", *time_split(summary), "", *FINDINGS, ""]
    out += [*planner_lines, ""] if planner_lines else []
    out += spread_section
    out += ["## Accuracy and time to it, free link", "", *accuracy_summary(derived), ""]
    out += ["Every GNNPipe run, 30 epochs: " + "; ".join(accuracy_sentences(derived)) + ".", ""]
    out += [*acc_lines, ""]
    out += ["## Rates", "", *rate_lines(rates, GPU_LINKS_GBIT, HBM_BYTES_PER_S, HBM_EFFICIENCY), ""]
    path.write_text("\n".join(out))


def bytes_bound(summary: List[dict]) -> str:
    """Why the bytes target is out of reach on the page's graph: the two modes' bytes per training step follow from
    the halo's size, which the pipeline cannot change."""
    def row(graph: str) -> Optional[dict]:
        return next((r for r in summary if r["graph"] == graph and r["model"] == "gcnii16" and r["sent"]["gnnpipe"]
                     and r["sent"]["graph_parallel"]), None)

    page, spread = row("page"), row("spread")
    measured = "" if page is None else (
        f" (measured: {page['sent']['graph_parallel'] / GIB:.2f} against {page['sent']['gnnpipe'] / GIB:.2f} GiB a "
        f"training step, {page['sent']['graph_parallel'] / page['sent']['gnnpipe']:.2f}x)")
    on_spread = "" if spread is None else (
        f"; the spread graph's halo of 0.81 |V| gives "
        f"{spread['sent']['graph_parallel'] / spread['sent']['gnnpipe']:.2f}x")
    return ("Bytes, and why the page's graph misses 5x: a GNNPipe training step sends every node's rows across its one "
            "stage boundary once forward and once back, 2 (S - 1) |V| d floats, and the last stage's logits; graph "
            "parallelism sends each partition's halo rows forward and their gradients back at every message-passing "
            "layer, 2 L |halo| d. With S = G = 2 their ratio is about L |halo| / |V|: on the page's graph the 2-way "
            "METIS halo holds 0.19 |V| rows, so GCNII-16's bound is about 3x" + measured + ", and 5x would need a halo "
            "of 0.31 |V| or more at 16 layers" + on_spread + ". GNNPipe already sends "
            "the least a 2-stage pipeline can (its halo rows' gradients stay on the stage that reads them); sending "
            "fewer would mean rounding the rows (e.g. to bfloat16), which it does not do silently.")


def targets(derived: Dict[tuple, dict], summary: List[dict], spread_derived: Dict[tuple, dict]) -> List[str]:
    """The issue's targets against the measured figures, per graph (every figure is read from the tables below)."""
    lines = ["| target | page's graph | spread graph |", "|---|---|---|"]

    def row_100(graph: str) -> Optional[dict]:  # GCNII-16 at the rate standing for 100 Gbit/s
        return next((r for r in summary if r["graph"] == graph and r["model"] == "gcnii16"
                     and "(= 100 Gbit/s" in r["name"]), None)

    def at_100(graph: str, key: str) -> str:
        row = row_100(graph)
        return "–" if row is None or row[key] is None else f"{row[key]:.2f}x"

    def sent_ratio(graph: str) -> str:
        row = row_100(graph)
        if row is None or not row["sent"]["gnnpipe"] or not row["sent"]["graph_parallel"]:
            return "–"
        return f"{row['sent']['graph_parallel'] / row['sent']['gnnpipe']:.2f}x"

    defaults = default_modes()

    def gaps(d: Dict[tuple, dict], which: Tuple[str, ...] = defaults) -> str:
        cells = []
        for (nodes, model, mode, seed), v in sorted(d.items()):
            exact = d.get((nodes, model, "exact", seed))
            if mode in which and exact and " (" not in model:
                cells.append(f"{model} {nodes // 1000:,}k seed {seed}: {(v['test'] - exact['test']) * 100:+.2f}")
        return "; ".join(cells) or "–"

    def tta(d: Dict[tuple, dict], which: Tuple[str, ...] = defaults) -> str:
        cells = [f"{model} {nodes // 1000:,}k seed {seed}: " + ("not reached" if v["ratio"] is None
                                                              else f"{v['ratio']:.2f}x")
                 for (nodes, model, mode, seed), v in sorted(d.items()) if mode in which and " (" not in model]
        return "; ".join(cells) or "–"

    def planner_hits(graph: str) -> str:
        rows = [r for r in summary if r["graph"] == graph and r["plan"] and r["faster_step"]]
        hits = [r for r in rows if r["train"].get(r["plan"]["choice"]) is not None
                and r["train"][r["plan"]["choice"]] <= 1.1 * r["train"][r["faster_step"]]]
        misses = [f"{r['model']} {r['name'].split(' (')[0]}" for r in rows if r not in hits]
        return f"{len(hits)} of {len(rows)}" + (f" (missed: {', '.join(misses)})" if misses else "")

    lines.append(f"| GP ÷ GNNPipe epoch at 100 Gbit/s, GCNII-16 (≥ 1.58x) | {at_100('page', 'ratio')} | "
                 f"{at_100('spread', 'ratio')} |")
    lines.append(f"| bytes GP ÷ GNNPipe (≥ 5x) | {sent_ratio('page')} | {sent_ratio('spread')} |")
    lines.append(f"| GNNPipe's s to 99% ÷ GP's at 100 Gbit/s, GCNII-16 (≤ 1 / 1.3 = 0.77x) | "
                 f"{at_100('page', 'acc_ratio')} | {at_100('spread', 'acc_ratio')} |")
    lines.append(f"| GNNPipe's test accuracy − exact's, defaults (within 0.5 points) | {gaps(derived)} | "
                 f"{gaps(spread_derived)} |")
    lines.append(f"| GNNPipe's s to 99% of exact's best val ÷ exact's, defaults (≤ 0.7x) | {tta(derived)} | "
                 f"{tta(spread_derived)} |")
    lines.append(f"| planner's training step within 10% of the faster, every rate | {planner_hits('page')} | "
                 f"{planner_hits('spread')} |")
    for strategy, name in (({"halo_gradients": "detach"}, "`GNNPipeStrategy(halo_gradients=\"detach\")` (the default "
                                                          "before `halo_gradients=\"auto\"`)"),
                           ({"refresh_every": 0}, "`GNNPipeStrategy(refresh_every=0)` (the default before "
                                                  "`refresh_every=\"auto\"`)")):
        old = (mode_key({"mode": "gnnpipe", "chunks": 8, "strategy": strategy}),)
        lines.append(f"| {name}: test accuracy − exact's (within 0.5 points) | {gaps(derived, old)} | "
                     f"{gaps(spread_derived, old)} |")
        lines.append(f"| {name}: s to 99% of exact's best val ÷ exact's (≤ 0.7x) | {tta(derived, old)} | "
                     f"{tta(spread_derived, old)} |")
    name = LABEL_EXACT_FORWARD
    lines.append(f"| {name}: GP ÷ GNNPipe epoch, s to 99% ÷ GP's, at 100 Gbit/s, GCNII-16 | "
                 f"{at_100('page', 'exact_forward_ratio')}, {at_100('page', 'exact_forward_acc_ratio')} | "
                 f"{at_100('spread', 'exact_forward_ratio')}, {at_100('spread', 'exact_forward_acc_ratio')} |")
    return lines


def answer(derived: Dict[tuple, dict], summary: List[dict], rates: Dict[int, dict]) -> List[str]:
    """The page's opening: per model and link, GNNPipe's epoch against graph parallelism's, bytes, planner; then
    accuracy and time to it against the exact single process. Every figure is read from the tables below."""
    out = ["**Answer.** Over a link: two 300,000-node, 6M-edge community graphs (the page's, whose long-range edges "
           "meet at a few connector nodes, and the spread graph, whose long-range edges touch every node), 2 "
           "processes on a 2-core CPU; epoch = training step + exact full-graph validation; link rates stand for "
           "GPUs joined by the named link (derivation at the end). Accuracy below it also at 1M nodes.", "",
           "| graph | model | link | GNNPipe s / epoch | graph parallel s / epoch | GP ÷ GNNPipe (≥ 1.58 at "
           "100 Gbit/s, "
           "16 layers) | bytes GP ÷ GNNPipe (≥ 5) | planner's choice (✓: its training step within 10% of the faster) | "
           "measured faster epoch |", "|---" * 9 + "|"]
    for row in summary:
        e, sent = row["epoch"], row["sent"]
        if not (e["gnnpipe"] and e["graph_parallel"]):
            continue
        ratio = sent["graph_parallel"] / sent["gnnpipe"] if sent["gnnpipe"] and sent["graph_parallel"] else None
        choice = "–" if row["plan"] is None else SHORT[row["plan"]["choice"]]
        train = row["train"]  # the planner estimates the training step: within 10% of the faster one, ✓
        picked = None if row["plan"] is None else train.get(row["plan"]["choice"])
        hit = "" if picked is None else (" ✓" if picked <= 1.1 * train[row["faster_step"]] else " ✗")
        out.append(f"| {GRAPHS[row['graph']]} | {row['model']} | {row['name']} | {e['gnnpipe']:.1f} | {e['graph_parallel']:.1f} | "
                   f"{row['ratio']:.2f}x | {'–' if ratio is None else f'{ratio:.2f}x'} | {choice}{hit} | "
                   f"{SHORT[row['fastest']]} |")
    out.append("")
    for graph, model in [(g, m) for g in GRAPHS for m in ("gcnii16", "ressage8")]:
        rows = [r for r in summary if r["model"] == model and r["graph"] == graph and r["ratio"]]
        wins = [f"{r['name'].split(' (')[0]} ({r['ratio']:.2f}x)" for r in rows if r["ratio"] > 1.0]
        loses = [f"{r['name'].split(' (')[0]} ({r['ratio']:.2f}x)" for r in rows if r["ratio"] <= 1.0]
        if rows:
            out.append(f"With {model} on the {GRAPHS[graph]}, GNNPipe's epoch is shorter than graph parallelism's on "
                       f"{', '.join(wins) or 'no link'}, and not on {', '.join(loses) or 'any other'} (GP ÷ GNNPipe).")
    out.append("")
    acc = accuracy_sentences(derived, defaults_only=True)
    mlp = {n: d for (n, m, mode, s), d in derived.items() if mode == "mlp"}
    if acc:
        out.append("Accuracy, free link, 30 epochs, GNNPipe's defaults (every option's run: [below]"
                   "(#accuracy-and-time-to-it-free-link)): " + "; ".join(acc) + "."
                   + (" The MLP on the node's own features reaches " + " and ".join(
                       f"{d['test']:.4f} ({n // 1000:,}k nodes)" for n, d in sorted(mlp.items()))
                      + ": the labels need the graph." if mlp else ""))
        out.append("")
    return out
