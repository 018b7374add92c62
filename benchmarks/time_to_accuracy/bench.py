"""Time to accuracy on a learnable large graph, over an emulated cluster link: the whole study from one command.

    python -m benchmarks.time_to_accuracy.bench              # measure what the cache lacks, then write the page
    python -m benchmarks.time_to_accuracy.bench --page-only  # the page from the cache alone
    python -m benchmarks.time_to_accuracy.bench --only accuracy|tuning|calibration|link|timing|large|spread|planner
    python -m benchmarks.time_to_accuracy.bench --only pairs [--pairs 4] [--nodes 300000 | --spread]  # pairs

Every run is one worker process (:mod:`benchmarks.time_to_accuracy.worker`) watched for the machine's memory, its
record appended to ``benchmarks/time_to_accuracy/runs.jsonl`` (``--force`` re-measures). Parts:

* **calibration**: the exact single process on one core (one rank's share of this machine) for the rate derivation.
* **link**: 2 epochs with validation (the second one timed) of GNNPipe and graph parallelism on the 300k graph in a
  network namespace whose loopback is shaped to each rate of :func:`~benchmarks.time_to_accuracy.rates.derived_rates`: GCNII-16 at every rate, the
  hybrid 2 x 2 at every rate but the 10 Gbit/s one (about 25 minutes there), residual GraphSAGE-8 on the free link
  and at the 100 Gbit/s rate.
  GNNPipe tuned, ``schedule="gpipe"`` (:data:`TUNED`), with GCNII-16 on the free link and at 100 Gbit/s.
* **large**: the 1M-node, 20M-edge rung, free link, :data:`EPOCHS` epochs with validation, one seed: residual
  GraphSAGE-8 under the exact single process, GNNPipe's defaults and graph parallelism, and the MLP (alone on the
  machine: their seconds are used).
* **spread**: GCNII-16 at the 100 Gbit/s rate on :data:`SPREAD` (the long-range edges spread over every node): GNNPipe
  with each ``evaluation`` and graph parallelism (2 epochs).
* **tuning**: GNNPipe's epoch with K = 4 and 16 beside the default K = 8 (2 epochs, no validation).
* **timing**: the exact single process's epoch measured with nothing else running (2 epochs with validation).
* **planner**: every layer's forward+backward on every chunk of the plans the planner weighs, one core, for the
  planner's predictions beside the link runs (:mod:`benchmarks.time_to_accuracy.planner`).
* **pairs** (only when named): alternating pairs of the exact single process and GNNPipe's defaults in one session
  (:mod:`benchmarks.time_to_accuracy.pairs`; their own file, ``pairs.jsonl``).
* **accuracy** (free link, validation every epoch, :data:`EPOCHS` epochs): the exact single process, GNNPipe's
  default and graph parallelism with residual GraphSAGE-8 and GCNII-16, the MLP; a second seed of exact and GNNPipe
  with GraphSAGE-8. Its seconds per epoch are not used (they come from the quiet runs above), so it may share the
  machine.

The parts run in this order: the timing-sensitive ones first, each alone on the machine.

Rates (:func:`~benchmarks.time_to_accuracy.rates.derived_rates`): a GPU computes an epoch in about the time its HBM needs for the epoch's bytes
(:func:`~benchmarks.time_to_accuracy.rates.gpu_epoch_seconds`); this machine's core needs ``T_cpu`` (calibration). To keep compute : communication as
on GPUs joined by a link of ``B`` Gbit/s, the emulated link gets ``B * T_gpu / T_cpu``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import List, Optional, Sequence


ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.harness.memory import GIB, read_process_peaks  # noqa: E402
from benchmarks.harness.process import classify, log_tail, run_watched  # noqa: E402
from benchmarks.harness.records import append_cache, cache_key, git_info, host_info, load_cache  # noqa: E402
from benchmarks.time_to_accuracy.graph import GraphSpec, on_page_graph  # noqa: E402
from benchmarks.time_to_accuracy.link import LinkUnavailable, shaped_loopback  # noqa: E402
from benchmarks.time_to_accuracy.page import EXACT_FORWARD  # noqa: E402
from benchmarks.time_to_accuracy.pairs import PAIR_MODELS, PAIRS, SPREAD_VARIANTS  # noqa: E402
from benchmarks.time_to_accuracy.rates import derived_rates  # noqa: E402

CACHE = Path(__file__).resolve().parent / "runs.jsonl"
PAGE = ROOT / "docs" / "results" / "time_to_accuracy.md"
EPOCHS = 30
SMALL, LARGE = 300_000, 1_000_000
TUNED = {"schedule": "gpipe"}  # GNNPipe's tuned option under a link (the link part)
GLIBC_HEAP = {"huge_pages": False, "heap_mmap_threshold": None}  # glibc's own heap in the ranks: faster, larger
TUNED_ACCURACY = {"halo_gradients": "stale"}  # the option docs/choosing.md names for deep GCNII on Tolokers
HISTORICAL = {"refresh_every": 0}  # halo rows read historical (last epoch's), as GNNPipe reads them: the default
# before refresh_every="auto", which refreshes the tables in every validation of a fit that validates every epoch
DETACH = {"halo_gradients": "detach"}  # the halo rows' gradients dropped: the default before halo_gradients="auto",
# which hands them to their owner chunks where every epoch's tables are exact (as in these fits)


def spec(nodes: int, model: str, mode: str, seed: int = 0, epochs: int = EPOCHS, validate: bool = True,
         chunks: int = 8, threads: Optional[int] = None, rate: Optional[float] = None,
         strategy: Optional[dict] = None, lr: Optional[float] = None, lr_schedule: Optional[str] = None) -> dict:
    """One run's parameters (its JSON is the cache key); ``strategy``: options beside the defaults; ``lr``,
    ``lr_schedule``: beside the model's constant learning rate (:mod:`benchmarks.time_to_accuracy.worker`)."""
    out = {"graph": GraphSpec(num_nodes=nodes).as_dict(), "model": model, "mode": mode, "seed": seed,
           "epochs": epochs, "validate": validate, "chunks": chunks, "rate_bits": rate}
    for key, value in (("threads", threads), ("strategy", strategy), ("lr", lr), ("lr_schedule", lr_schedule)):
        if value:
            out[key] = value
    return out


def accuracy_specs() -> List[dict]:
    """In the order they are worth measuring: the first seven settle GNNPipe against exact and graph parallelism at
    each depth and the MLP baseline; then a second seed of exact and GNNPipe per model; then GCNII-16's tuned runs:
    GNNPipe's options, fewer chunks, and other learning rates (:func:`spec`'s ``lr`` and ``lr_schedule``)."""
    out = [spec(SMALL, "ressage8", m) for m in ("exact", "gnnpipe", "graph_parallel", "mlp")]
    out += [spec(SMALL, "gcnii16", m) for m in ("exact", "gnnpipe", "graph_parallel")]
    out += [spec(SMALL, "ressage8", m, seed=1) for m in ("exact", "gnnpipe")]
    out += [spec(SMALL, "gcnii16", m, seed=1) for m in ("exact", "gnnpipe")]
    # the historical rows without a refresh (the default before refresh_every="auto"), both models and seeds
    out += [spec(SMALL, model, "gnnpipe", seed=seed, strategy=HISTORICAL) for model in ("ressage8", "gcnii16")
            for seed in (0, 1)]
    # exact halo rows, their gradients dropped (the default between refresh_every="auto" and halo_gradients="auto")
    out += [spec(SMALL, model, "gnnpipe", seed=seed, strategy=DETACH) for model in ("ressage8", "gcnii16")
            for seed in (0, 1)]
    # tuned for accuracy: the option docs/convergence.md names for deep GCNII (the default diverges here, see the page),
    # and exact history tables at every epoch's start (one step per epoch: every halo row read is then exact)
    # (and every second epoch's start: half the extra forward)
    tuned = ({**TUNED_ACCURACY, **HISTORICAL}, {"refresh_every": 1, **DETACH}, {"refresh_every": 2},
             {"history_momentum": 0.5, **HISTORICAL}, {"refresh_every": 1, **TUNED_ACCURACY})
    out += [spec(SMALL, "gcnii16", "gnnpipe", strategy=s) for s in tuned]
    # fewer chunks (fewer stale reads), and the learning rate: halved, or annealed (exact training beside each)
    out += [spec(SMALL, "gcnii16", "gnnpipe", chunks=k, strategy=HISTORICAL) for k in (2, 4)]
    out += [spec(SMALL, "gcnii16", m, **lr, **({"strategy": HISTORICAL} if m == "gnnpipe" else {}))
            for lr in ({"lr": 0.005}, {"lr_schedule": "cosine"}) for m in ("exact", "gnnpipe")]
    out += [spec(SMALL, "gcnii16", "gnnpipe", lr_schedule="cosine", strategy={"history_momentum": 0.5, **HISTORICAL})]
    # the exact forward (refresh_every=1, no forward beside validation's) with the gradients of the rows read
    # historical delivered in the same epoch: both seeds
    out += [spec(SMALL, "gcnii16", "gnnpipe", seed=seed, strategy=EXACT_FORWARD) for seed in (0, 1)]
    return out + [spec(SMALL, "ressage8", "gnnpipe", strategy=EXACT_FORWARD)]  # and on the shallower model


def large_specs() -> List[dict]:
    """The 1M-node, 20M-edge rung, one seed: residual GraphSAGE-8 (the MLP first, cheap, then exact, GNNPipe's
    defaults and graph parallelism); then GCNII-16: exact, GNNPipe with :data:`~benchmarks.time_to_accuracy.page.EXACT_FORWARD`
    (the option that matches exact training at 300k), exact training's quiet epoch (2 epochs), its defaults and graph
    parallelism. Made alone on the machine, so their seconds are quiet ones."""
    out = [spec(LARGE, "ressage8", m) for m in ("mlp", "exact", "gnnpipe", "graph_parallel")]
    out += [spec(LARGE, model, "gnnpipe", strategy=HISTORICAL) for model in ("ressage8", "gcnii16")]
    out += [spec(LARGE, "gcnii16", "exact"), spec(LARGE, "gcnii16", "gnnpipe", strategy=EXACT_FORWARD)]
    out.append(spec(LARGE, "gcnii16", "gnnpipe", strategy=DETACH))
    out.append(spec(LARGE, "gcnii16", "exact", epochs=2))  # its quiet epoch (2 epochs, the second timed)
    return out + [spec(LARGE, "gcnii16", m) for m in ("gnnpipe", "graph_parallel")]


def tuning_specs() -> List[dict]:
    return [spec(SMALL, "ressage8", "gnnpipe", epochs=2, validate=False, chunks=k) for k in (4, 8, 16)]


def timing_specs() -> List[dict]:
    """The exact process's epoch measured alone (2 epochs with validation); the 2- and 4-process modes' come from
    the link part's free-link runs."""
    return [spec(SMALL, m, "exact", epochs=2) for m in ("ressage8", "gcnii16")]


def calibration_specs() -> List[dict]:
    return [spec(SMALL, m, "exact", epochs=2, validate=False, threads=1) for m in ("ressage8", "gcnii16")]


def link_specs(records: List[dict]) -> List[dict]:
    rates = derived_rates(records)
    hundred = rates[100]["rate_bits"] if 100 in rates else None
    slowest = rates[10]["rate_bits"] if 10 in rates else None  # the hybrid there: about 25 minutes, not run
    out = []
    for rate in [None] + [r["rate_bits"] for _, r in sorted(rates.items(), key=lambda kv: -kv[0])]:
        modes = ("gnnpipe", "graph_parallel") + (("hybrid",) if rate != slowest else ())
        out += [spec(SMALL, "gcnii16", m, epochs=2, rate=rate) for m in modes]
        if rate in (None, hundred):
            out += [spec(SMALL, "ressage8", m, epochs=2, rate=rate) for m in ("gnnpipe", "graph_parallel")]
    # tuned: GPipe streams every chunk's activations before the first backward, so a slow link overlaps compute
    out += [spec(SMALL, m, "gnnpipe", epochs=2, strategy=GLIBC_HEAP) for m in ("ressage8", "gcnii16")]  # time over memory
    out += [spec(SMALL, "gcnii16", "gnnpipe", epochs=2, rate=r, strategy=TUNED) for r in (None, hundred)]
    # the option for deep models: 4 epochs, so that the median validation is the one that is also the refresh
    return out + [spec(SMALL, "gcnii16", "gnnpipe", epochs=4, rate=r, strategy=EXACT_FORWARD) for r in (None, hundred)]





SPREAD = GraphSpec(num_nodes=SMALL, connectors=1.0)
"""The 300k graph with its long-range edges spread over every node instead of a few connectors (same METIS cuts)."""


def spread_specs(records: List[dict]) -> List[dict]:
    """On :data:`SPREAD` (the long-range edges spread over every node), as on the page's graph: 2 epochs of GNNPipe's
    defaults and graph parallelism with GCNII-16 on the free link and at the 100 and 400 Gbit/s rates, with residual
    GraphSAGE-8 on the free link and at 100 Gbit/s, GNNPipe with ``evaluation="graph_parallel"`` named at 100 Gbit/s
    (``"auto"`` picks ``"pipeline"`` there) and the exact single process's quiet epoch; then :data:`EPOCHS` epochs on
    the free link for accuracy: the MLP, exact and GNNPipe with both models, and GCNII-16 under
    :data:`~benchmarks.time_to_accuracy.page.EXACT_FORWARD`. The 10 Gbit/s rate is not run (graph parallelism's epoch there: about 30
    minutes)."""
    rates = derived_rates(records)
    if 100 not in rates:
        return []
    r100, r400 = rates[100]["rate_bits"], rates.get(400, {}).get("rate_bits")
    out = []
    for model, model_rates in (("gcnii16", (None, r100, r400)), ("ressage8", (None, r100))):
        for i, rate in enumerate(model_rates):
            if i == 0 or rate is not None:  # the free link (None) first, then each derived rate there is
                out += [spec(SMALL, model, m, epochs=2, rate=rate) for m in ("gnnpipe", "graph_parallel")]
    out.append(spec(SMALL, "gcnii16", "gnnpipe", epochs=2, rate=r100, strategy={"evaluation": "graph_parallel"}))
    out += [spec(SMALL, model, "exact", epochs=2) for model in ("ressage8", "gcnii16")]  # its quiet epoch
    out += [spec(SMALL, "ressage8", "gnnpipe", epochs=2, chunks=k) for k in (2, 4)]  # fewer chunks: smaller halos
    out.append(spec(SMALL, "ressage8", "gnnpipe", epochs=2, strategy=GLIBC_HEAP))
    out.append(spec(SMALL, "ressage8", "mlp"))
    out += [spec(SMALL, model, m) for model in ("ressage8", "gcnii16") for m in ("exact", "gnnpipe")]
    out += [spec(SMALL, model, "gnnpipe", strategy=HISTORICAL) for model in ("ressage8", "gcnii16")]
    out.append(spec(SMALL, "gcnii16", "gnnpipe", strategy=EXACT_FORWARD))  # the option for deep models
    out.append(spec(SMALL, "gcnii16", "gnnpipe", strategy=DETACH))
    out.append(spec(SMALL, "gcnii16", "gnnpipe", epochs=4, rate=r100, strategy=EXACT_FORWARD))  # its epoch at 100
    for s in out:
        s["graph"] = SPREAD.as_dict()
    return out


def key_of(s: dict) -> str:
    return cache_key(s)


def load(cache: Path = CACHE) -> List[dict]:
    """Cached records, the latest per key."""
    return list({rec["key"]: rec for rec in load_cache(cache)}.values())


def measure(s: dict, timeout_s: float) -> dict:
    """Run one spec in a fresh worker (inside a shaped namespace when it has a rate); return its record."""
    run_dir = Path(tempfile.mkdtemp(prefix="tta-"))
    cmd = [sys.executable, "-m", "benchmarks.time_to_accuracy.worker", json.dumps(s), str(run_dir)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if s["mode"] in ("exact", "mlp"):  # the single process with torch's huge pages, as the strategies' ranks have them
        env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    load_before = os.getloadavg()[0]
    if s["rate_bits"] is None:
        watch = run_watched(cmd, run_dir / "log.txt", timeout_s, int(1.5 * GIB), ROOT, env=env)
    else:
        with shaped_loopback(s["rate_bits"]) as prefix:
            watch = run_watched(prefix + cmd, run_dir / "log.txt", timeout_s, int(1.5 * GIB), ROOT, env=env)
    result_path = run_dir / "result.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    tail = log_tail(run_dir / "log.txt")
    rec = {"key": key_of(s), "spec": s, "status": classify(watch, bool(result), tail), **result,
           "processes": read_process_peaks(run_dir), "machine": watch, "load_before": load_before,
           "host": host_info(), "git": git_info(), "time": datetime.datetime.now().isoformat(timespec="seconds")}
    if rec["status"] != "ok":
        rec["error_tail"] = tail
    return rec


def run_pairs(pairs: int, nodes: int, timeout_s: float, path: Path = PAIRS, spread: bool = False,
              models: Sequence[str] = PAIR_MODELS) -> None:
    """Measure ``pairs`` alternating (exact, GNNPipe) pairs per model of ``models`` on ``nodes`` nodes,
    each run at most ``timeout_s`` seconds, appending every record (with ``batch``, this call's start) to ``path``.
    With ``spread``: on :data:`SPREAD` (``nodes`` ignored), each pair followed by GNNPipe with each of
    :data:`~benchmarks.time_to_accuracy.pairs.SPREAD_VARIANTS`.

    Raises:
        ValueError: ``pairs`` < 1.
    """
    if pairs < 1:
        raise ValueError(f"run_pairs: `pairs` must be >= 1 (got {pairs}).")

    batch = datetime.datetime.now().isoformat(timespec="seconds")
    graph = SPREAD.as_dict() if spread else None
    runs = [("exact", None), ("gnnpipe", None)] + [("gnnpipe", v) for v in (SPREAD_VARIANTS if spread else ())]
    for model in models:
        for i in range(pairs):
            for mode, options in runs:
                s = spec(SMALL if spread else nodes, model, mode, epochs=2, strategy=options)
                if graph is not None:
                    s["graph"] = graph
                rec = {**measure(s, timeout_s), "batch": batch}
                append_cache(path, rec)
                print(f"pairs: {s['graph']['num_nodes']:,} {'spread ' if spread else ''}{model} {mode}"
                      f"{'' if options is None else f' {options}'} pair {i + 1}: {rec['status']}", flush=True)


def run(parts: List[str], force: bool, timeout_s: float, cache: Path = CACHE,
        modes: Optional[List[str]] = None) -> None:
    """Measure every spec of ``parts`` that the cache lacks (all with ``force``), appending as it goes; ``modes``:
    only the specs of these modes."""
    records = load(cache)
    done = {r["key"] for r in records if r["status"] == "ok"}
    for part in parts:
        specs = {"calibration": calibration_specs, "tuning": tuning_specs, "accuracy": accuracy_specs,
                 "timing": timing_specs, "large": large_specs}.get(part)
        todo = specs() if specs is not None else (spread_specs if part == "spread" else link_specs)(records)
        todo = [s for s in todo if (key_of(s) not in done or force) and not (modes and s["mode"] not in modes)]

        def report(s: dict, rec: dict) -> None:
            rate = s["rate_bits"]
            print(f"{part}: {s['graph']['num_nodes']:,} {s['model']} {s['mode']} seed {s['seed']} K {s['chunks']}"
                  f"{'' if rate is None else f' at {rate / 1e6:.0f} Mbit/s'}: {rec['status']}", flush=True)

        if not measure_all(todo, lambda s: measure(s, timeout_s), cache, report):
            return
        records = load(cache)


def measure_all(todo: List[dict], measure_one, cache: Path, report) -> bool:
    """Measure every spec of ``todo`` with ``measure_one(spec) -> record``, appending each record to ``cache`` and
    calling ``report(spec, record)``; returns ``False`` (and stops) when the link cannot be emulated here."""
    for s in todo:
        try:
            rec = measure_one(s)
        except LinkUnavailable as err:
            print(f"link: cannot emulate a link here, stopping: {err}", flush=True)
            return False
        append_cache(cache, rec)
        report(s, rec)
    return True


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", nargs="+", choices=["calibration", "tuning", "accuracy", "timing", "link", "large",
                                                 "spread", "planner", "pairs"])
    p.add_argument("--pairs", type=int, help="with --only pairs: alternating pairs per model (default 4)")
    p.add_argument("--nodes", type=int, help=f"with --only pairs: the graph's nodes (default {SMALL})")
    p.add_argument("--spread", action="store_true", help="with --only pairs: on the spread graph, with GNNPipe's "
                   "allocator variants after each pair")
    p.add_argument("--page-only", action="store_true")
    p.add_argument("--force", action="store_true")
    p.add_argument("--modes", nargs="+", choices=["exact", "gnnpipe", "graph_parallel", "hybrid", "mlp"],
                   help="measure only these modes' runs")
    p.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per run")
    args = p.parse_args(argv)
    if (args.pairs is not None or args.nodes is not None or args.spread) and "pairs" not in (args.only or []):
        p.error("--pairs, --nodes and --spread belong to --only pairs (got them without it)")
    if args.spread and args.nodes is not None:
        p.error(f"--spread runs the {SMALL:,}-node spread graph; leave out --nodes")
    pairs, nodes = (4 if args.pairs is None else args.pairs), (SMALL if args.nodes is None else args.nodes)
    if pairs < 1:
        p.error(f"--pairs must be >= 1 (got {pairs})")
    if nodes < GraphSpec().community_size:
        p.error(f"--nodes must be at least one community, {GraphSpec().community_size} nodes (got {nodes})")
    parts = [] if args.page_only else args.only or ["calibration", "link", "spread", "tuning", "timing", "large",
                                                    "accuracy", "planner"]
    if "pairs" in parts:  # not cached: every call measures its pairs (benchmarks/time_to_accuracy/pairs.py)
        run_pairs(pairs, nodes, args.timeout, spread=args.spread)
    runs = [part for part in parts if part not in ("planner", "pairs")]
    if runs:
        run(runs, args.force, args.timeout, modes=args.modes)
    from benchmarks.time_to_accuracy.page import write_page

    records = [r for r in load() if on_page_graph(r)]
    if "planner" in parts:  # the chunk times the cache lacks (about one 1-core epoch a plan), for the notes' account
        from benchmarks.time_to_accuracy.planner import planner_predictions

        planner_predictions(records, GraphSpec(num_nodes=SMALL), True)
        planner_predictions(records, SPREAD, True)
    write_page(records, PAGE, [r for r in load() if not on_page_graph(r)])
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
