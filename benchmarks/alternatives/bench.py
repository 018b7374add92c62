"""GNNPipe against what a PyG user picks instead, on learnable 300k- and 1M-node graphs: the whole study from one command.

    python -m benchmarks.alternatives.bench               # measure what the cache lacks, then write the page
    python -m benchmarks.alternatives.bench --page-only   # the page from the cache alone
    python -m benchmarks.alternatives.bench --only tuning|accuracy|link [--nodes 300000] [--models ressage8]

Every run is one worker process (:mod:`benchmarks.alternatives.worker`) watched for the machine's memory, its record
appended to ``benchmarks/alternatives/runs.jsonl`` (``--force`` measures again). Parts:

* **tuning** (300k and 1M, both models): GNNPipe with several steps an epoch, :data:`STEP_VARIANTS` and
  :data:`LARGE_STEP_VARIANTS` (chunks, chunks a step, grouping), early stopping, to pick the setting :data:`STEPS`
  that the accuracy part runs.
* **accuracy** (300k then 1M, residual GraphSAGE-8 then GCNII-16, free link): the exact single process,
  ``GNNPipeStrategy()`` as it comes (one step an epoch), GNNPipe with :data:`STEPS`, Cluster-GCN and neighbour
  sampling under DDP (:mod:`benchmarks.alternatives.baselines`), each until early stopping (:data:`PATIENCE` epochs
  without a better validation accuracy), :data:`MAX_EPOCHS` or its budget of seconds.
* **link** (300k, both models): 2 epochs (the second timed) of GNNPipe's two settings, and one epoch of GraphSAGE-8's
  neighbour sampling (minutes long, so its warm-up is a small part), on the free link and at the
  rate that stands for 100 Gbit/s between GPUs (:func:`~benchmarks.time_to_accuracy.rates.derived_rates`, from the
  time-to-accuracy benchmark's calibration); the numerics do not depend on the link, so a method's time to accuracy
  there is its free-link run's epochs at the shaped epoch's seconds.

The accuracy runs are the timing-sensitive ones: each is made alone on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.harness.memory import GIB, read_process_peaks  # noqa: E402
from benchmarks.harness.process import classify, log_tail, run_watched  # noqa: E402
from benchmarks.harness.records import cache_key, git_info, host_info, load_cache  # noqa: E402
from benchmarks.time_to_accuracy.graph import GraphSpec  # noqa: E402
from benchmarks.time_to_accuracy.bench import measure_all  # noqa: E402
from benchmarks.time_to_accuracy.link import shaped_loopback  # noqa: E402

CACHE = Path(__file__).resolve().parent / "runs.jsonl"
PAGE = ROOT / "docs" / "results" / "alternatives.md"
SMALL, LARGE = 300_000, 1_000_000
MODELS = ("ressage8", "gcnii16")
TRAIN = 0.1  # labelled fraction: 10% of the nodes
PATIENCE = 5
MAX_EPOCHS = {SMALL: 100, LARGE: 60}
BUDGET_S = {SMALL: 1800, LARGE: 3600}
NEIGHBOR_BUDGET_S = {SMALL: 900, LARGE: 1800}  # a pass over the training nodes costs minutes at 8 and 16 layers
METHODS = ("exact", "gnnpipe", "gnnpipe_steps", "cluster_gcn", "cluster_gcn_coarse", "neighbor_ddp")
COARSE_CLUSTERS = {"cluster_parts": 300, "cluster_batch": 10}
"""Cluster-GCN with fewer, larger clusters than PyG's example (the setting of the issue that asked for this page:
300 clusters, 10 a batch, 30 steps an epoch): fewer edges dropped, fewer steps."""
def _steps(chunks: int, per_step: int, groups: str) -> dict:
    return {"chunks": chunks, "chunks_per_step": per_step, "chunk_groups": groups}


STEP_VARIANTS = {
    "ressage8": (_steps(8, 2, "fixed"), _steps(8, 2, "shuffle"), _steps(16, 4, "shuffle"), _steps(32, 4, "shuffle"),
                 _steps(32, 4, "fixed"), _steps(32, 2, "shuffle"), _steps(64, 4, "shuffle"), _steps(128, 4, "shuffle")),
    "gcnii16": (_steps(8, 2, "fixed"), _steps(32, 4, "shuffle"), _steps(32, 4, "fixed"), _steps(64, 4, "shuffle"),
                _steps(128, 4, "shuffle")),
}
"""Settings of several steps an epoch the tuning part runs at 300k nodes, per model (chunks ``K``, chunks a step,
grouping)."""
LARGE_STEP_VARIANTS = {"ressage8": (_steps(128, 4, "shuffle"),), "gcnii16": (_steps(128, 4, "shuffle"),)}
"""Settings the tuning part runs at 1M nodes besides :data:`STEPS` (an accuracy run), each for at most
:data:`LARGE_TUNING_BUDGET_S` seconds: enough to see when it reaches the target."""
LARGE_TUNING_BUDGET_S = 420
STEPS = _steps(64, 4, "shuffle")
"""The setting of several steps an epoch that the accuracy part runs (picked by the tuning part; see the page)."""
SAMPLER_PYTHON = os.environ.get("GNNPIPE_SAMPLER_PYTHON")
"""An interpreter whose environment has a sampler backend (torch-sparse or pyg-lib) for ``neighbor_ddp``; default
this one."""


def graph(nodes: int) -> dict:
    return GraphSpec(num_nodes=nodes, train=TRAIN).as_dict()


def spec(nodes: int, model: str, method: str, seed: int = 0, epochs: Optional[int] = None,
         rate: Optional[float] = None, steps: Optional[dict] = None, budget_s: Optional[float] = None) -> dict:
    """One run's parameters (its JSON is the cache key). ``method`` is a worker method or ``"gnnpipe_steps"``
    (``gnnpipe`` with ``steps``, default :data:`STEPS`); ``epochs``: a fixed number (timing), else early stopping
    within ``budget_s`` seconds (default :data:`BUDGET_S` of the size)."""
    out = {"graph": graph(nodes), "model": model, "method": method, "seed": seed, "rate_bits": rate}
    if method == "gnnpipe_steps":
        out.update(method="gnnpipe", **(steps or STEPS))
    if method == "cluster_gcn_coarse":
        out.update(method="cluster_gcn", **COARSE_CLUSTERS)
    if epochs is not None:
        out["epochs"] = epochs
    else:
        budget = budget_s or (NEIGHBOR_BUDGET_S if method == "neighbor_ddp" else BUDGET_S)[nodes]
        out.update(max_epochs=MAX_EPOCHS[nodes], patience=PATIENCE, budget_s=budget)
    return out


def tuning_specs(models=MODELS) -> List[dict]:
    return ([spec(SMALL, m, "gnnpipe_steps", steps=v) for m in models for v in STEP_VARIANTS[m]]
            + [spec(LARGE, m, "gnnpipe_steps", steps=v, budget_s=LARGE_TUNING_BUDGET_S)
               for m in models for v in LARGE_STEP_VARIANTS.get(m, ())])


def accuracy_specs(sizes=(SMALL, LARGE), models=MODELS) -> List[dict]:
    return [spec(n, m, method) for n in sizes for m in models for method in METHODS]


def link_specs(records: List[dict], models=MODELS) -> List[dict]:
    from benchmarks.time_to_accuracy.bench import CACHE as TTA_CACHE, load as tta_load
    from benchmarks.time_to_accuracy.rates import derived_rates

    rates = derived_rates(tta_load(TTA_CACHE))
    if 100 not in rates:
        return []
    out = []
    for rate in (None, rates[100]["rate_bits"]):
        for m in models:
            out += [spec(SMALL, m, method, epochs=2, rate=rate) for method in ("gnnpipe", "gnnpipe_steps")]
        # neighbour sampling: one epoch (minutes long, so its warm-up is a small part), GraphSAGE-8's for both models
        # (DDP all-reduces the parameters only, so the link adds little to either)
        out.append(spec(SMALL, "ressage8", "neighbor_ddp", epochs=1, rate=rate))
    return out


def load(cache: Path = CACHE) -> List[dict]:
    """Cached records, the latest per key."""
    return list({rec["key"]: rec for rec in load_cache(cache)}.values())


def measure(s: dict, timeout_s: float) -> dict:
    """Run one spec in a fresh worker (inside a shaped namespace when it has a rate); return its record."""
    run_dir = Path(tempfile.mkdtemp(prefix="alt-"))
    python = SAMPLER_PYTHON if s["method"] == "neighbor_ddp" and SAMPLER_PYTHON else sys.executable
    cmd = [python, "-m", "benchmarks.alternatives.worker", json.dumps(s), str(run_dir)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if s["method"] in ("exact", "cluster_gcn", "neighbor_ddp"):  # torch's huge pages, as the strategy's ranks have
        env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    if s["rate_bits"] is None:
        watch = run_watched(cmd, run_dir / "log.txt", timeout_s, int(1.5 * GIB), ROOT, env=env)
    else:
        with shaped_loopback(s["rate_bits"], name=f"gnnpipe-alt-{os.getpid()}") as prefix:
            watch = run_watched(prefix + cmd, run_dir / "log.txt", timeout_s, int(1.5 * GIB), ROOT, env=env)
    result_path = run_dir / "result.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    tail = log_tail(run_dir / "log.txt")
    rec = {"key": cache_key(s), "spec": s, "status": classify(watch, bool(result), tail), **result,
           "processes": read_process_peaks(run_dir), "machine": watch, "host": host_info(), "git": git_info(),
           "time": datetime.datetime.now().isoformat(timespec="seconds")}
    if rec["status"] != "ok":
        rec["error_tail"] = tail
    return rec


def run(parts: List[str], force: bool, timeout_s: float, sizes: List[int], models: List[str],
        methods: Optional[List[str]] = None, cache: Path = CACHE) -> None:
    """Measure every spec of ``parts`` that the cache lacks (all with ``force``), appending as it goes."""
    for part in parts:
        records = load(cache)
        done = {r["key"] for r in records if r["status"] == "ok"}
        todo = {"tuning": lambda: tuning_specs(models), "accuracy": lambda: accuracy_specs(sizes, models),
                "link": lambda: link_specs(records, models)}[part]()
        from benchmarks.alternatives.page import method_of as name
        todo = [s for s in todo if (cache_key(s) not in done or force) and not (methods and name(s) not in methods)]

        def report(s: dict, rec: dict) -> None:
            rate, steps = s["rate_bits"], ""
            if "chunks_per_step" in s:
                steps = f" K {s['chunks']} c {s['chunks_per_step']} {s['chunk_groups']}"
            ended = f", {len(rec['epochs'])} epochs, {rec['stopped']}" if rec["status"] == "ok" else ""
            print(f"{part}: {s['graph']['num_nodes']:,} {s['model']} {name(s)}{steps}"
                  f"{'' if rate is None else f' at {rate / 1e6:.0f} Mbit/s'}: {rec['status']}{ended}", flush=True)

        if not measure_all(todo, lambda s: measure(s, timeout_s), cache, report):
            return


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", nargs="+", choices=["tuning", "accuracy", "link"])
    p.add_argument("--nodes", nargs="+", type=int, choices=[SMALL, LARGE], help="graph sizes of the accuracy part")
    p.add_argument("--models", nargs="+", choices=list(MODELS))
    p.add_argument("--methods", nargs="+", choices=list(METHODS), help="measure only these methods' runs")
    p.add_argument("--page-only", action="store_true")
    p.add_argument("--force", action="store_true")
    p.add_argument("--timeout", type=float, default=2 * 3600, help="seconds per run")
    args = p.parse_args(argv)
    parts = [] if args.page_only else args.only or ["tuning", "accuracy", "link"]
    if parts:
        run(parts, args.force, args.timeout, args.nodes or [SMALL, LARGE], args.models or list(MODELS),
            args.methods)
    from benchmarks.alternatives.page import write_page

    write_page(load(), PAGE)
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
