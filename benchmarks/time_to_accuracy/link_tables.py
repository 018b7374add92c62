"""The page's tables over an emulated link: each mode's epoch and bytes per rate, what the link adds to an epoch,
and the rates' derivation."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from benchmarks.harness.memory import gib
from benchmarks.harness.page import fmt_ratio, markdown_table
from benchmarks.time_to_accuracy.run_records import EXACT_FORWARD, GRAPHS, SHORT, mode_key, ok, timed


LINK_SESSION = ("2026-12-06T14:00:00", "2026-12-06T15:30:00")
"""Start and end (ISO times) of the series of runs the link table reads on the page's graph: every rate and mode was
measured then, alone on the machine, so its rows and what a rate adds to the free link never pair runs of different
series or hosts. ``None``: each mode's latest run."""


def link_runs(records: List[dict], session: Optional[Tuple[str, str]] = None,
              ) -> Tuple[Dict[tuple, dict], Dict[tuple, dict], Dict[tuple, dict]]:
    """The runs the link table reads, the latest of each (300k, K = 8, with validation): each mode's defaults and
    GPipe's (at most 3 epochs), keyed ``(model, rate_bits, mode)``, and :data:`EXACT_FORWARD`'s (at most 4),
    keyed ``(model, rate_bits)``. With ``session`` (start, end; e.g. :data:`LINK_SESSION` for the page's graph) the
    defaults' and GPipe's runs are that series' where it has one of the key (a key it lacks: the latest run)."""
    runs: Dict[tuple, dict] = {}
    tuned: Dict[tuple, dict] = {}
    exact_forward: Dict[tuple, dict] = {}

    def order(r: dict) -> Tuple[bool, str]:  # the series' runs last (they win), each group oldest first
        t = r.get("time", "")
        return session is not None and session[0] <= t <= session[1], t

    for rec in sorted(records, key=order):
        s = rec["spec"]
        if s["epochs"] <= 4 and s["validate"] and s["graph"]["num_nodes"] == 300_000 and s["chunks"] == 8 \
                and s["mode"] in SHORT:
            if s.get("strategy") == EXACT_FORWARD:
                exact_forward[(s["model"], s["rate_bits"])] = rec
            elif s["epochs"] > 3:
                continue
            elif not s.get("strategy"):
                runs[(s["model"], s["rate_bits"], s["mode"])] = rec
            elif s["strategy"] == {"schedule": "gpipe"}:
                tuned[(s["model"], s["rate_bits"], s["mode"])] = rec
    return runs, tuned, exact_forward


def link_names(rates: Dict[int, dict]) -> Dict[Optional[float], str]:
    """Each emulated rate's name on the page (``None``: the free link), from :func:`derived_rates`'s ``rates``."""
    names: Dict[Optional[float], str] = {None: "free (loopback)"}
    names.update({r["rate_bits"]: f"{gbit} Gbit/s ({r['rate_bits'] / 1e6:,.0f} Mbit/s emulated)"
                  for gbit, r in sorted(rates.items())})
    return names


def link_summary(records: List[dict], derived: Dict[tuple, dict], rates: Dict[int, dict],
                 graph: str = "page") -> List[dict]:
    """Per model and rate of ``graph`` (:data:`GRAPHS`; 300k nodes, seed 0): each mode's epoch (training,
    validation), bytes a training step, and seconds to 99% of exact's best validation accuracy (the free-link
    accuracy run's epochs to it times the epoch at the rate; graph parallelism, which computes exact training's step,
    takes its own run's epochs, else exact's)."""
    gbit_of = {r["rate_bits"]: gbit for gbit, r in rates.items()}
    runs = link_runs(records, LINK_SESSION if graph == "page" else None)[0]
    exact_key = mode_key({"mode": "gnnpipe", "chunks": 8, "strategy": EXACT_FORWARD})
    summary = []
    for model in ("ressage8", "gcnii16"):
        for rate, name in link_names(rates).items():
            recs = {m: runs.get((model, rate, m)) for m in SHORT}
            if not any(ok(r) for r in recs.values()):
                continue
            split = {m: (timed(r, "train_s"), timed(r, "val_s")) if ok(r) else None for m, r in recs.items()}
            epoch = {m: sum(v) if v else None for m, v in split.items()}
            acc = {m: derived.get((300_000, model, m, 0)) for m in SHORT}
            acc["gnnpipe"] = acc["gnnpipe"] or derived.get((300_000, model, exact_key, 0))  # what the defaults ran
            acc["graph_parallel"] = acc["graph_parallel"] or derived.get((300_000, model, "exact", 0))
            to_acc = {m: acc[m]["epochs"] * epoch[m] if acc[m] and acc[m]["epochs"] and epoch[m] else None
                      for m in SHORT}
            exact = derived.get((300_000, model, "exact", 0))
            summary.append({"graph": graph, "model": model, "rate": rate, "gbit": gbit_of.get(rate), "name": name,
                            "split": split, "epoch": epoch, "to_acc": to_acc,
                            "exact_s": exact["seconds"] if exact else None,
                            "sent": {m: timed(r, "sent_bytes") if ok(r) else None for m, r in recs.items()}})
    return summary


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """``a / b``, or ``None`` when either is missing."""
    return a / b if a and b else None


def link_table(summary: List[dict]) -> List[str]:
    """The Details table over a link: per graph, model and rate, each mode's training + validation seconds an epoch,
    GNNPipe's seconds to 99% against graph parallelism's, and the bytes a training step."""
    rows = []
    for r in summary:
        split, sent = r["split"], r["sent"]
        cell = lambda m: "–" if split[m] is None else "{:.1f} + {:.1f}".format(*split[m])  # noqa: E731
        acc = ratio(r["to_acc"]["gnnpipe"], r["to_acc"]["graph_parallel"])
        rows.append([GRAPHS[r["graph"]], r["model"], r["name"], cell("gnnpipe"), cell("graph_parallel"),
                     cell("hybrid"), "–" if acc is None else fmt_ratio(acc),
                     ", ".join(gib(sent[m]) for m in SHORT)])
    return markdown_table(["graph", "model", "link", "GNNPipe train + val s / epoch", "graph parallel",
                           "hybrid 2x2", "GNNPipe s to 99% ÷ GP's", "GiB sent / training step (GNNPipe, GP, "
                           "hybrid)"], rows)


def time_split(summary: List[dict]) -> List[str]:
    """What a rate adds to each mode's epoch over the free link's (training, validation), beside the seconds the
    training step's bytes need at the rate alone (``8 * bytes / R``)."""
    free = {(r["graph"], r["model"]): r for r in summary if r["rate"] is None}
    rows = []
    for row in summary:
        base = free.get((row["graph"], row["model"]))
        if row["rate"] is None or base is None:
            continue
        for mode in ("gnnpipe", "graph_parallel"):
            now, then, sent = row["split"].get(mode), base["split"].get(mode), row["sent"].get(mode)
            if not now or not then:
                continue
            rows.append([GRAPHS[row["graph"]], row["model"], row["name"], SHORT[mode], f"{now[0] - then[0]:.1f}",
                         f"{now[1] - then[1]:.1f}", "–" if not sent else f"{8 * sent / row['rate']:.1f}"])
    return markdown_table(["graph", "model", "link", "mode", "training s added by the link",
                           "validation s added", "training step's bytes at R alone (s)"], rows)


def rate_lines(rates: Dict[int, dict]) -> List[str]:
    """How each emulated rate stands for a GPU link: the exact epoch on one core against the bytes it reads at HBM
    speed (:mod:`benchmarks.time_to_accuracy.rates`)."""
    return markdown_table(["GPU link", "model it is derived from", "T_cpu: exact epoch, one core (s)",
                           "T_gpu: bytes at HBM (s)", "emulated rate"],
                          [[f"{gbit} Gbit/s", r["model"], f"{r['cpu_s']:.2f}", f"{r['gpu_s'] * 1e3:.1f} ms",
                            f"{r['rate_bits'] / 1e6:,.0f} Mbit/s"] for gbit, r in sorted(rates.items())])
