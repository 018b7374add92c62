"""The page's accuracy figures: the free-link accuracy runs, their time to 99% of exact's best validation accuracy,
and the table of today's defaults against exact training."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from benchmarks.harness.page import fmt_ratio, markdown_table
from benchmarks.time_to_accuracy.run_records import (EXACT_FORWARD, GRAPHS, best_epoch, default_modes, largest,
                                                     mode_key, mode_order, model_key, ok, timed, to_target)


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


def derive(records: List[dict]) -> Dict[tuple, dict]:
    """The figures of every free-link accuracy run whose exact run succeeded, by ``(nodes, model, mode, seed)``:
    epochs and seconds to 99% of exact's best validation accuracy (and their ratio to exact's), test accuracy at the
    best validation epoch, the seconds of an epoch.

    Epochs come from the long runs; seconds from the quiet short runs of the same mode (:func:`quiet_epochs`; the
    long runs may have shared the machine), else from the long run itself (``quiet`` is then ``False``).
    """
    runs = accuracy_runs(records)
    quiet = quiet_epochs(records)
    derived: Dict[tuple, dict] = {}
    for nodes, model, seed in sorted({k[:2] + (k[3],) for k in runs}):
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
            rec = runs[(nodes, model, mode, seed)]
            if not ok(rec):
                continue
            epochs, _ = to_target(rec, target)
            _, val, test = best_epoch(rec)
            train_s, val_s, is_quiet = epoch_seconds(rec, mode)
            seconds = epochs * (train_s + val_s) if epochs else None
            derived[(nodes, model, mode, seed)] = {
                "train_s": train_s, "val_s": val_s, "epochs": epochs, "seconds": seconds, "quiet": is_quiet,
                "ratio": seconds / exact_s if seconds and exact_s else None, "test": test, "val": val,
                "target": target, "curve": [e.get("val_acc") for e in rec["epochs"]],
                "rss": largest(rec, "rss"), "uss": largest(rec, "uss")}
    return derived


def defaults_run(derived: Dict[tuple, dict], nodes: int, model: str, seed: int) -> Optional[dict]:
    """The accuracy run of ``GNNPipeStrategy()``'s defaults: its own, else :data:`EXACT_FORWARD`'s (what the
    defaults resolve to in these fits: every epoch validated in full precision, no dropout)."""
    own, resolved = default_modes()
    return derived.get((nodes, model, own, seed)) or derived.get((nodes, model, resolved, seed))


def accuracy_table(by_graph: Dict[str, Dict[tuple, dict]]) -> List[str]:
    """Per graph, size, model and seed: test accuracy at the best validation epoch of exact training, GNNPipe's
    defaults, graph parallelism and the MLP; epochs to 99% of exact's best validation accuracy; GNNPipe's seconds to
    it over exact's (free link)."""
    rows = []
    for graph, derived in by_graph.items():
        for nodes, model, seed in sorted({(k[0], k[1], k[3]) for k in derived}):
            exact, pipe = derived.get((nodes, model, "exact", seed)), defaults_run(derived, nodes, model, seed)
            if exact is None or pipe is None or " (" in model:
                continue
            gp, mlp = derived.get((nodes, model, "graph_parallel", seed)), derived.get((nodes, "ressage8", "mlp", seed))
            epochs = lambda d: "not reached" if d["epochs"] is None else str(d["epochs"])  # noqa: E731
            rows.append([GRAPHS[graph], f"{nodes // 1000:,}k", model, seed, f"{exact['test']:.4f}",
                         f"{pipe['test']:.4f} ({(pipe['test'] - exact['test']) * 100:+.2f})",
                         "–" if gp is None else f"{gp['test']:.4f}",
                         "–" if mlp is None or model != "ressage8" else f"{mlp['test']:.4f}",
                         f"{epochs(exact)}, {epochs(pipe)}",
                         "–" if pipe["ratio"] is None else fmt_ratio(pipe["ratio"])])
    return markdown_table(["graph", "nodes", "model", "seed", "exact", "GNNPipe (points − exact)", "graph parallel",
                           "MLP (no graph)", "epochs to 99%: exact, GNNPipe", "GNNPipe s to 99% ÷ exact's"], rows)
