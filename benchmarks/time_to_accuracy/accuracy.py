"""The page's accuracy tables: the free-link accuracy runs, their time to 99% of exact's best validation accuracy,
and the sentences and pair epochs read from them."""

from __future__ import annotations

import statistics
from typing import Dict, List, Tuple

from benchmarks.harness.memory import gib
from benchmarks.time_to_accuracy.run_records import (EXACT_FORWARD, LABEL, best_epoch, default_modes, largest,
                                                     mode_key, mode_order, model_key, ok, timed, to_target)


def pair_epochs(derived: Dict[tuple, dict]) -> Dict[Tuple[int, str], List[Tuple[int, int, int]]]:
    """``(nodes, model) -> [(seed, GNNPipe's epochs to 99%, exact's)]`` of the defaults' accuracy runs."""
    out: Dict[Tuple[int, str], List[Tuple[int, int, int]]] = {}
    for (nodes, model, mode, seed), d in sorted(derived.items()):
        exact = derived.get((nodes, model, "exact", seed))
        if mode in default_modes() and exact and " (" not in model:
            out.setdefault((nodes, model), []).append((seed, d["epochs"], exact["epochs"]))
    return out

def accuracy_runs(records: List[dict]) -> Dict[tuple, dict]:
    """The free-link accuracy runs by ``(nodes, model, mode, seed)`` (:func:`model_key`, :func:`mode_key`)."""
    out = {}
    for rec in records:
        s = rec["spec"]
        if s["rate_bits"] is None and s["validate"] and s["epochs"] >= 20:
            out[(s["graph"]["num_nodes"], model_key(s), mode_key(s), s["seed"])] = rec
    return out


def quiet_epochs(records: List[dict]) -> Dict[tuple, Tuple[float, float]]:
    """Training and validation seconds per epoch measured with nothing else running (the 3-epoch runs with validation
    on the free link: the timing part and the link part's free-link runs; 4 epochs for :data:`EXACT_FORWARD`, whose
    last validation is not its refresh), by ``(nodes, model, mode)`` (:func:`mode_key`)."""
    out = {}
    exact_forward = mode_key({"mode": "gnnpipe", "chunks": 8, "strategy": EXACT_FORWARD})
    for rec in sorted(records, key=lambda r: r.get("time", "")):  # oldest first: the latest run of a mode wins
        s = rec["spec"]
        if ok(rec) and s["epochs"] <= 4 and s["validate"] and s["rate_bits"] is None and s["chunks"] == 8 \
                and s.get("threads") is None:
            seconds = (timed(rec, "train_s"), timed(rec, "val_s"))
            out[(s["graph"]["num_nodes"], s["model"], mode_key(s))] = seconds
            if mode_key(s) == "gnnpipe":  # GNNPipeStrategy() resolves to EXACT_FORWARD in these fits
                out[(s["graph"]["num_nodes"], s["model"], exact_forward)] = seconds
    # A short run's timed epoch is the same without a refresh: its validation is the last one, which writes no table,
    # and a training step costs the same reading exact or historical rows (the refresh is validation's forward). The
    # halo rows' gradients do cost time: the runs without them are timed with them dropped.
    # The defaults are refresh_every=1, halo_gradients="fresh" in a fit that validates every epoch (EXACT_FORWARD).
    detach = mode_key({"mode": "gnnpipe", "chunks": 8, "strategy": {"halo_gradients": "detach"}})
    for (nodes, model, mode), seconds in list(out.items()):
        if mode == detach:
            out.setdefault((nodes, model, "gnnpipe_refresh_every0"), seconds)
            out.setdefault((nodes, model, detach + "_refresh_every1"), seconds)
    return out


def accuracy_rows(records: List[dict]) -> Tuple[List[str], Dict[tuple, dict]]:
    """Per (graph, model, seed): one row per mode; and the derived figures by ``(nodes, model, mode, seed)``.

    Epochs come from the 80-epoch runs; seconds from the quiet 3-epoch runs of the same mode (:func:`quiet_epochs`;
    the long runs shared the machine), else from the long run itself (marked ``*``).
    """
    runs = accuracy_runs(records)
    quiet = quiet_epochs(records)
    derived: Dict[tuple, dict] = {}
    lines = ["| nodes | model | seed | mode | train s / epoch | validation s / epoch | epochs to 99% of exact's best "
             "val | s to it (÷ exact) | test acc at best val | best val acc | MiB sent / epoch | largest process "
             "peak RSS GiB (USS) |", "|---" * 12 + "|"]
    for key in sorted({k[:2] + (k[3],) for k in runs}):
        nodes, model, seed = key
        exact = runs.get((nodes, model, "exact", seed))
        if not ok(exact):
            continue
        target = 0.99 * best_epoch(exact)[1]

        def epoch_seconds(rec: dict, mode: str) -> Tuple[float, float, bool]:
            base = (nodes, model.split(" (")[0], mode)  # the learning rate does not change an epoch's seconds
            if base in quiet:
                return (*quiet[base], True)
            return timed(rec, "train_s"), timed(rec, "val_s"), False

        exact_epochs, _ = to_target(exact, target)
        exact_s = exact_epochs * sum(epoch_seconds(exact, "exact")[:2]) if exact_epochs else None
        for mode in sorted({k[2] for k in runs if k[:2] == (nodes, model) and k[3] == seed}, key=mode_order):
            rec = runs.get((nodes, model, mode, seed))
            if rec is None:
                continue
            if not ok(rec):
                lines.append(f"| {nodes:,} | {model} | {seed} | {LABEL[mode]} | {rec['status']} |" + " – |" * 7)
                continue
            epochs, _ = to_target(rec, target)
            _, val, test = best_epoch(rec)
            sent = timed(rec, "sent_bytes")
            train_s, val_s, is_quiet = epoch_seconds(rec, mode)
            seconds = epochs * (train_s + val_s) if epochs else None
            d = {"train_s": train_s, "val_s": val_s, "epochs": epochs, "seconds": seconds, "quiet": is_quiet,
                 "ratio": seconds / exact_s if seconds and exact_s else None, "test": test, "val": val,
                 "target": target, "sent": sent, "rss": largest(rec, "rss"), "uss": largest(rec, "uss")}
            derived[(nodes, model, mode, seed)] = d
            reached = "not reached" if epochs is None else f"{epochs}"
            secs = "–" if seconds is None else (f"{seconds:.0f}" + (f" ({d['ratio']:.2f}x)" if d["ratio"] else ""))
            star = "" if is_quiet else "*"
            lines.append(f"| {nodes:,} | {model} | {seed} | {LABEL[mode]} | {train_s:.2f}{star} | {val_s:.2f}{star} | "
                         f"{reached} | {secs} | {test:.4f} | {val:.4f} | "
                         f"{'–' if sent is None else f'{sent / 2**20:,.0f}'} | {gib(d['rss'])} ({gib(d['uss'])}) |")
    return lines, derived


def accuracy_summary(derived: Dict[tuple, dict]) -> List[str]:
    """Per (graph, model, mode): test accuracy at the best validation epoch, mean over seeds, minus exact's mean over
    the same seeds."""
    lines = ["| nodes | model | mode | seeds | test acc at best val (mean) | − exact (points) | epochs to 99% | "
             "s to 99% ÷ exact |", "|---" * 8 + "|"]
    groups: Dict[tuple, List[dict]] = {}
    seeds: Dict[tuple, List[int]] = {}
    for (nodes, model, mode, seed), d in derived.items():
        groups.setdefault((nodes, model, mode), []).append(d)
        seeds.setdefault((nodes, model, mode), []).append(seed)
    for (nodes, model, mode) in sorted(groups, key=lambda k: (k[0], k[1], mode_order(k[2]))):
        ds = groups[(nodes, model, mode)]
        exact = [derived[(nodes, model, "exact", s)] for s in seeds[(nodes, model, mode)]
                 if (nodes, model, "exact", s) in derived]
        acc = statistics.mean(d["test"] for d in ds)
        gap = (acc - statistics.mean(d["test"] for d in exact)) * 100 if len(exact) == len(ds) else None
        epochs = [d["epochs"] for d in ds]
        ratios = [d["ratio"] for d in ds if d["ratio"] is not None]
        lines.append(f"| {nodes:,} | {model} | {LABEL[mode]} | {len(ds)} | {acc:.4f} | "
                     f"{'–' if gap is None else f'{gap:+.2f}'} | "
                     f"{', '.join('not reached' if e is None else str(e) for e in epochs)} | "
                     f"{', '.join(f'{r:.2f}x' for r in ratios) or '–'} |")
    return lines

def accuracy_sentences(derived: Dict[tuple, dict], defaults_only: bool = False) -> List[str]:
    """Per GNNPipe run (``defaults_only``: those of ``GNNPipeStrategy()``'s defaults): its test accuracy at the best
    validation epoch and time to 99% against exact's."""
    defaults = default_modes()
    acc = []
    for (nodes, model, mode, seed), d in sorted(derived.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][3],
                                                                                 mode_order(kv[0][2]))):
        exact = derived.get((nodes, model, "exact", seed))
        if not mode.startswith("gnnpipe") or exact is None or (defaults_only and mode not in defaults):
            continue
        gap = (d["test"] - exact["test"]) * 100
        ratio = "not reached" if d["ratio"] is None else f"in {d['ratio']:.2f}x exact's seconds"
        name = LABEL[mode].replace(" (2 processes)", "").replace(", K = 8", "")
        acc.append(f"{nodes // 1000:,}k nodes, {model}, seed {seed}, {name}: test accuracy {d['test']:.4f} against "
                   f"exact's {exact['test']:.4f} ({gap:+.2f} points; target within 0.5); 99% of exact's best "
                   "validation accuracy "
                   + (f"after {d['epochs']} epochs against {exact['epochs']}, {ratio}" if d["epochs"]
                      else "never reached") + " (target ≤ 0.7x)")
    return acc
