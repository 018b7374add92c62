"""Alternating pairs: the exact single process and ``GNNPipeStrategy()`` one after the other, several times, in one
session, so that their ratio is not a ratio of two hosts or two moods of one host.

    python -m benchmarks.time_to_accuracy.bench --only pairs [--pairs 4] [--nodes 300000]
    python -m benchmarks.time_to_accuracy.bench --only pairs --spread [--pairs 2]  # the spread graph, below

Each pair (:func:`~benchmarks.time_to_accuracy.bench.run_pairs`) is two 2-epoch fits with validation (the second
epoch timed), exact first, for residual GraphSAGE-8 and GCNII-16; every record goes to
``benchmarks/time_to_accuracy/pairs.jsonl`` with ``batch`` (the start of the call),
not to ``runs.jsonl``, whose link table reads one session's runs of each mode. The page's table of pairs
(:func:`pair_lines`) gives per batch the medians and the range of the pairs' ratios. The first batch's 1M rows
(``2026-12-06T16:50:59``) were assembled from that session's 1M runs, made one by one through
:func:`~benchmarks.time_to_accuracy.bench.measure` in the same order (exact, then GNNPipe), not by one call; so were
those of batch ``2026-12-06T18:35:25`` (1M GraphSAGE-8, with a run of :data:`~benchmarks.time_to_accuracy.bench.
GLIBC_HEAP` after the first pair's GNNPipe run, kept in ``runs.jsonl``). Batch ``2026-12-06T19:28:22`` holds no
pair: GNNPipe's defaults and ``heap_mmap_threshold=32 * 2**20`` alternating twice (1M GraphSAGE-8, made the same way),
quoted on the page; ``2026-12-06T19:36:28`` none either: GNNPipe's defaults with ``num_chunks=16`` and 8 alternating
twice, the same way.

    python -m benchmarks.time_to_accuracy.bench --only pairs --spread [--pairs 2]

measures both models on the spread graph (:data:`~benchmarks.time_to_accuracy.bench.SPREAD`), and after each pair
GNNPipe with each of :data:`SPREAD_VARIANTS` (allocator settings): a variant is compared with its pair's exact run.
Its first two batches measured one model each (``2026-12-06T19:10:16`` GraphSAGE-8, the next GCNII-16).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from benchmarks.time_to_accuracy.graph import on_page_graph

PAIRS = Path(__file__).resolve().parent / "pairs.jsonl"
PAIR_MODELS = ("ressage8", "gcnii16")
"""The models of each batch, in this order (:func:`~benchmarks.time_to_accuracy.bench.run_pairs`)."""
SPREAD_VARIANTS = ({"heap_mmap_threshold": 32 * 2**20}, {"huge_pages": False, "heap_mmap_threshold": None})
"""GNNPipe's options measured after each pair on the spread graph: the largest glibc mmap threshold (32 MiB: the
chunks' local rows, about 32 MB there, come from the heap) and glibc's own heap without huge pages."""


def _graph(rec: dict) -> str:
    return "page" if on_page_graph(rec) else "spread"


def _label(rec: dict) -> str:
    options = rec["spec"].get("strategy") or {}
    return rec["spec"]["model"] + "".join(f", `{k}={v!r}`" for k, v in sorted(options.items()))


def _epoch(rec: dict) -> Tuple[float, float]:
    last = rec["epochs"][-1]
    return last["train_s"], last["val_s"]


def pair_lines(records: List[dict], epochs: Dict[Tuple[int, str], List[Tuple[int, int, int]]],
               spread_epochs: Optional[Dict[Tuple[int, str], List[Tuple[int, int, int]]]] = None) -> List[str]:
    """Per batch, graph (the page's or the spread one) and model: the two modes' training and validation seconds
    (range), the medians' ratio of epochs (train + validation) and the range of the pairs' ratios, the seconds to 99%
    of exact's best validation accuracy against exact's (the medians' ratio times the graph's accuracy runs' epochs
    to it), and the largest process's peak USS. A GNNPipe run with options (a variant) is compared with
    the latest ok exact run before it in its group, in a row of its own labelled with the options.

    Args:
        records: The pair runs (:data:`PAIRS`).
        epochs: ``(nodes, model) -> [(seed, GNNPipe's epochs to 99%, exact's)]`` from the accuracy runs.
        spread_epochs: The same from the spread graph's accuracy runs (its rows show ``–`` without them).

    Returns:
        Markdown table lines: a header, a rule, a row per batch, graph and model with at least one pair (seconds;
        GiB of peak USS). Raises nothing for records without pairs (they are left out).
    """
    groups: Dict[Tuple[str, str, int, str], Dict[str, List[dict]]] = {}
    before: Dict[Tuple[str, str, int, str], dict] = {}  # each group's previous record, of any status
    exact: Dict[Tuple[str, str, int, str], dict] = {}  # the latest exact run of each group, if it ended well
    for rec in records:  # a pair: an ok exact run and the ok GNNPipe run right after it in its group
        s = rec["spec"]
        key = (rec["batch"], _graph(rec), s["graph"]["num_nodes"], s["model"])
        last = before.get(key)
        if s["mode"] == "exact":
            exact.pop(key, None)
            if rec.get("status") == "ok":
                exact[key] = rec
        elif s["mode"] == "gnnpipe" and rec.get("status") == "ok" and s.get("strategy"):  # a variant: its pair's
            if key in exact:
                pair = groups.setdefault(key[:3] + (_label(rec),), {})
                pair.setdefault("exact", []).append(exact[key])
                pair.setdefault("gnnpipe", []).append(rec)
        elif (s["mode"] == "gnnpipe" and rec.get("status") == "ok" and last is not None
                and last["spec"]["mode"] == "exact" and last.get("status") == "ok"):
            pair = groups.setdefault(key, {})
            pair.setdefault("exact", []).append(last)
            pair.setdefault("gnnpipe", []).append(rec)
        before[key] = rec
    lines = ["| batch | graph | nodes | model | pairs | exact train + val s | GNNPipe train + val s | epoch ÷ exact "
             "(medians; pairs) | s to 99% ÷ exact (≤ 0.7x; epochs: GNNPipe, exact) | peak USS, largest process: "
             "GNNPipe (exact) |", "|---" * 10 + "|"]
    for (batch, graph, nodes, model), by_mode in sorted(groups.items()):
        exact, pipe = by_mode.get("exact", []), by_mode.get("gnnpipe", [])
        n = min(len(exact), len(pipe))
        if not n:
            continue
        e, p = [_epoch(r) for r in exact[:n]], [_epoch(r) for r in pipe[:n]]
        ratios = [sum(b) / sum(a) for a, b in zip(e, p)]
        med = sum(statistics.median(x[i] for x in p) for i in (0, 1)) / sum(
            statistics.median(x[i] for x in e) for i in (0, 1))

        def span(rows: List[Tuple[float, float]]) -> str:
            t, v = [r[0] for r in rows], [r[1] for r in rows]
            return f"{min(t):.1f}-{max(t):.1f} + {min(v):.1f}-{max(v):.1f}"

        def uss(recs: List[dict]) -> float:
            return max(v["uss"] for r in recs for v in r["processes"].values()) / 2**30

        runs = (epochs if graph == "page" else spread_epochs or {}).get((nodes, model), [])
        to99 = "; ".join(f"seed {seed}: {med * g / x:.2f}x ({g}, {x})" for seed, g, x in runs if g and x)
        lines.append(f"| {batch} | {graph} | {nodes:,} | {model} | {n} | {span(e)} | {span(p)} | {med:.2f}x; "
                     f"{min(ratios):.2f}x-{max(ratios):.2f}x | {to99 or '–'} | {uss(pipe[:n]):.2f} "
                     f"({uss(exact[:n]):.2f}) GiB |")
    return lines
