"""The page's tables over an emulated link: each mode's epoch and bytes per rate, where the time goes, the spread
graph's section, and the rates' derivation."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from benchmarks.harness.memory import gib
from benchmarks.time_to_accuracy.accuracy import accuracy_rows, accuracy_summary
from benchmarks.time_to_accuracy.prose import SPREAD_INTRO
from benchmarks.time_to_accuracy.run_records import EXACT_FORWARD, SHORT, mode_key, ok, timed


LINK_SESSION = ("2026-12-06T14:00:00", "2026-12-06T15:30:00")
"""Start and end (ISO times) of the session whose runs the link table reads: every rate and mode of the page's graph
was measured then, alone on the machine, so its rows and their split (free link + what the rate adds) never pair
runs of different sessions or hosts. ``None``: each mode's latest run."""


def link_runs(records: List[dict], session: Optional[Tuple[str, str]] = None,
              ) -> Tuple[Dict[tuple, dict], Dict[tuple, dict], Dict[tuple, dict]]:
    """The runs the link table reads, the latest of each (300k, K = 8, with validation): each mode's defaults and
    GPipe's (at most 3 epochs), keyed ``(model, rate_bits, mode)``, and :data:`EXACT_FORWARD`'s (at most 4),
    keyed ``(model, rate_bits)``. With ``session`` (start, end; e.g. :data:`LINK_SESSION` for the page's graph) the
    defaults' and GPipe's runs are that session's where it has one of the key (a key it lacks: the latest run)."""
    runs: Dict[tuple, dict] = {}
    tuned: Dict[tuple, dict] = {}
    exact_forward: Dict[tuple, dict] = {}
    def order(r: dict) -> Tuple[bool, str]:  # the session's runs last (they win), each group oldest first
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


def link_table(records: List[dict], derived: Dict[tuple, dict], rates: Dict[int, dict],
               planner: Dict[tuple, dict], graph: str = "page") -> Tuple[List[str], List[dict]]:
    """Per model and rate: epoch (train + validation) of each mode, GP ÷ GNNPipe, time to accuracy, planner; the
    summary rows carry ``graph`` (:data:`GRAPHS`)."""
    by_rate = {None: "free (loopback)"}
    by_rate.update({r["rate_bits"]: f"{r['rate_bits'] / 1e6:,.0f} Mbit/s (= {gbit} Gbit/s between GPUs)"
                    for gbit, r in rates.items()})
    lines = ["| model | link | GNNPipe train + val = s / epoch | GNNPipe, `schedule=\"gpipe\"` | graph parallel | "
             "hybrid 2x2 | GP ÷ GNNPipe epoch | GNNPipe s to 99% (÷ GP) | GiB sent / training step (GNNPipe, GP, "
             "hybrid) | planner: predicted training s / epoch (GNNPipe, GP), choice | measured faster training step |",
             "|---" * 11 + "|"]
    summary = []
    runs, tuned, exact_forward = link_runs(records, LINK_SESSION if graph == "page" else None)
    exact_key = mode_key({"mode": "gnnpipe", "chunks": 8, "strategy": EXACT_FORWARD})
    for model in ("ressage8", "gcnii16"):
        for rate, name in by_rate.items():
            recs = {m: runs.get((model, rate, m)) for m in SHORT}
            if not any(ok(r) for r in recs.values()):
                continue
            split = {m: (timed(r, "train_s"), timed(r, "val_s")) if ok(r) else None for m, r in recs.items()}
            epoch = {m: sum(v) if v else None for m, v in split.items()}
            sent = {m: timed(r, "sent_bytes") if ok(r) else None for m, r in recs.items()}
            # graph parallelism computes exact training's step: without its own accuracy run, exact's epochs
            acc = {m: derived.get((300_000, model, m, 0)) for m in SHORT}
            acc["gnnpipe"] = acc["gnnpipe"] or derived.get((300_000, model, exact_key, 0))  # what the defaults ran
            acc["graph_parallel"] = acc["graph_parallel"] or derived.get((300_000, model, "exact", 0))
            to_acc = {m: (acc[m]["epochs"] * epoch[m]) if acc[m] and acc[m]["epochs"] and epoch[m] else None
                      for m in SHORT}
            ratio = epoch["graph_parallel"] / epoch["gnnpipe"] if epoch["gnnpipe"] and epoch["graph_parallel"] else None
            acc_ratio = (to_acc["gnnpipe"] / to_acc["graph_parallel"]
                         if to_acc["gnnpipe"] and to_acc["graph_parallel"] else None)
            plan = planner.get((model, rate))
            fastest = min((m for m in ("gnnpipe", "graph_parallel") if epoch[m]), key=lambda m: epoch[m], default=None)
            train = {m: v[0] if v else None for m, v in split.items()}  # what the planner estimates
            faster_step = min((m for m in ("gnnpipe", "graph_parallel") if train[m]), key=lambda m: train[m],
                              default=None)
            plan_cell = "–" if plan is None else (f"{plan['gnnpipe']:.1f}, {plan['graph_parallel']:.1f}: "
                                                  f"{SHORT[plan['choice']]}")
            t = tuned.get((model, rate, "gnnpipe"))
            tuned_s = timed(t, "train_s") + timed(t, "val_s") if ok(t) else None
            x = exact_forward.get((model, rate))  # refresh_every=1, halo_gradients="fresh": its epoch, to accuracy
            x_epoch = timed(x, "train_s") + timed(x, "val_s") if ok(x) else None
            x_acc = derived.get((300_000, model, exact_key, 0))
            x_to_acc = x_acc["epochs"] * x_epoch if x_epoch and x_acc and x_acc["epochs"] else None
            cell = lambda m: "–" if epoch[m] is None else f"{epoch[m]:.1f}"  # noqa: E731
            pipe = "–" if split["gnnpipe"] is None else "{:.1f} + {:.1f} = {:.1f}".format(*split["gnnpipe"],
                                                                                        epoch["gnnpipe"])
            pipe_acc = "–" if to_acc["gnnpipe"] is None else f"{to_acc['gnnpipe']:.0f}"
            lines.append(f"| {model} | {name} | {pipe} | {'–' if tuned_s is None else f'{tuned_s:.1f}'} | "
                         f"{cell('graph_parallel')} | {cell('hybrid')} | "
                         f"{'–' if ratio is None else f'{ratio:.2f}x'} | "
                         f"{pipe_acc}{'' if acc_ratio is None else f' ({acc_ratio:.2f}x)'} | "
                         f"{', '.join(gib(sent[m]) for m in SHORT)} | {plan_cell} | "
                         f"{SHORT.get(faster_step, '–')} |")
            summary.append({"graph": graph, "model": model, "rate": rate, "name": name, "epoch": epoch, "ratio": ratio,
                            "acc_ratio": acc_ratio, "sent": sent, "plan": plan, "fastest": fastest,
                            "tuned": tuned_s, "split": split, "train": train, "faster_step": faster_step,
                            "exact_forward_ratio": (epoch["graph_parallel"] / x_epoch
                                                    if x_epoch and epoch["graph_parallel"] else None),
                            "exact_forward_acc_ratio": (x_to_acc / to_acc["graph_parallel"]
                                                        if x_to_acc and to_acc["graph_parallel"] else None)})
    return lines, summary


def time_split(summary: List[dict]) -> List[str]:
    """Where an epoch's time goes under a link, per model and mode: the free link's training and validation
    seconds (compute, bubble and the host's own transfers) and what the rate adds to each; beside it the seconds
    the training step's bytes need at the rate alone (``8 * bytes / R``)."""
    free = {(row["model"]): row for row in summary if row["rate"] is None}
    lines = ["| model | link | mode | training s: free link + added by the link | validation s: free + added | "
             "training bytes at R alone (s) |", "|---" * 6 + "|"]
    for row in summary:
        base = free.get(row["model"])
        if row["rate"] is None or base is None:
            continue
        for mode in ("gnnpipe", "graph_parallel"):
            now, then, sent = row["split"].get(mode), base["split"].get(mode), row["sent"].get(mode)
            if not now or not then:
                continue
            alone = "–" if not sent else f"{8 * sent / row['rate']:.1f}"
            lines.append(f"| {row['model']} | {row['name']} | {SHORT[mode]} | {then[0]:.1f} + {now[0] - then[0]:.1f} | "
                         f"{then[1]:.1f} + {now[1] - then[1]:.1f} | {alone} |")
    return lines

def spread_lines(records: List[dict], rates: Dict[int, dict],
                 planner: Dict[tuple, dict]) -> Tuple[List[str], List[dict], Dict[tuple, dict]]:
    """The section on the graph whose long-range edges touch every node (the ``spread`` part): its link table,
    the graph-parallel evaluation named explicitly, and its accuracy; with the link summary and accuracy figures."""
    if not any(ok(r) for r in records):
        return [], [], {}
    acc_lines, derived = accuracy_rows(records)
    link_lines, summary = link_table(records, derived, rates, planner, graph="spread")
    lines = ["## A graph whose long-range edges touch every node", "", SPREAD_INTRO, "", *link_lines, ""]
    named = [r for r in records if ok(r) and r["spec"].get("strategy") == {"evaluation": "graph_parallel"}]
    for rec in named:
        s = rec["spec"]
        row = next((r for r in summary if r["model"] == s["model"] and r["rate"] == s["rate_bits"]), None)
        if row and row["split"]["gnnpipe"]:
            lines += [f"With `evaluation=\"graph_parallel\"` named ({s['model']}, {row['name']}) GNNPipe's "
                      f"validation takes {timed(rec, 'val_s'):.1f} s against {row['split']['gnnpipe'][1]:.1f} s for "
                      f"the pipelined one (training {timed(rec, 'train_s'):.1f} s against "
                      f"{row['split']['gnnpipe'][0]:.1f} s).", ""]
    if derived:
        lines += [*accuracy_summary(derived), "", *acc_lines, ""]
    return lines, summary, derived


def rate_lines(rates: Dict[int, dict], links, hbm: float, eff: float) -> List[str]:
    lines = ["| GPU link | model it is derived from | T_cpu: exact epoch, one core (s) | T_gpu: bytes at HBM (s) | "
             "emulated rate |", "|---|---|---|---|---|"]
    for gbit, r in sorted(rates.items()):
        lines.append(f"| {gbit} Gbit/s | {r['model']} | {r['cpu_s']:.2f} | {r['gpu_s'] * 1e3:.1f} ms | "
                     f"{r['rate_bits'] / 1e6:,.0f} Mbit/s |")
    return lines
