"""Scale benchmark: GNNPipe against the best single-process PyG loop and graph parallelism, 250k to 2M nodes.

What it measures, per (nodes, model, layers, mode), each run in its own fresh subprocess
(``benchmarks/scale/worker.py``) so that memory is per mode:

* epoch time: median of the epochs after the first (seconds; ``--epochs 4`` gives 3 timed epochs);
* per-process peak memory (USS, PSS, RSS; bytes) of the launching process and of every rank, sampled every
  0.2 s by a thread in each process (``benchmarks/harness/memory.py``), plus the kernel's ``VmHWM``;
* the machine's used memory (``psutil.virtual_memory().used``) before and at its peak during the run;
* bytes sent per epoch, all ranks (``comm/sent_total`` logged by the strategies); wall time; failures (out of
  memory, killed, timeout: the error tail is recorded, the ladder goes on).

Graph: a stochastic block model built in ``O(|E|)`` (``benchmarks/scale/graph.py``): average degree 20, 64 features,
8 classes, 80% of the edges inside blocks, ``--blocks 64`` contiguous blocks with class = block % 8 (so METIS has
blocks to find and every class spans 8 blocks). Models: PyG ``GCN`` and ``GraphSAGE``, hidden 64, Adam (lr 0.01),
cross-entropy on ``train_mask``, one full-graph step per epoch, no validation. Modes:
``pyg_edge_index`` and ``pyg_csr`` (plain loops, 2 threads; ``pyg_csr`` is the best single-process baseline),
``trainer_single`` (Lightning, 1 process, 2 threads), ``gnnpipe_k8`` / ``gnnpipe_k16`` (``GNNPipeStrategy``,
2 processes x 1 thread, K = 8 / 16 chunks, GPipe), ``gnnpipe_1f1b_k8`` (the same with ``schedule="1f1b"``, K = 8),
``gnnpipe_ckpt_k8`` / ``gnnpipe_1f1b_ckpt_k8`` (with recomputation), ``gnnpipe_1f1b_bf16h_k8`` (1F1B with
``history_dtype="bfloat16"``) and ``graph_parallel`` (``GraphParallelStrategy``, 2 x 1, K = 2).

Every process of a run starts with torch's transparent huge pages on (``THP_MEM_ALLOC_ENABLE=1``: CPU tensors of
2 MiB and more faulted in 2 MiB at a time), the single-process baselines too; ``--no-huge-pages`` runs all with
``0``.

Needs ``pip install -e ".[bench]"`` (psutil for the memory sampling, matplotlib for the plot).

Every measured run appends one JSON line to ``--cache`` (default ``benchmarks/scale/runs.jsonl``); a rerun
measures only what is missing (``--force`` re-measures everything selected, ``--retry-failed`` the failed
rungs), then rewrites ``--out``/scale.md and scale.png from the cache. Larger rungs of a (model, layers, mode) whose smaller rung ran out of memory or time are skipped
(``--no-skip`` runs them anyway). Command lines:

    python -m benchmarks.scale.run                                         # the whole ladder: 250k, 1M, 2M nodes
    python -m benchmarks.scale.run --nodes 1000000 --models gcn --layers 16 --modes pyg_csr gnnpipe_k8
    python -m benchmarks.scale.run --page-only                             # the page from the cache, nothing measured
    python -m benchmarks.scale.run --selfcheck                             # CSR path == edge_index path (1e-5)
    python -m benchmarks.scale.run --nodes 20000 --epochs 3 --cache /tmp/scale_test.jsonl --out /tmp/scale_page
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness.memory import GIB, read_process_peaks  # noqa: E402
from benchmarks.harness.process import classify, log_tail, run_watched  # noqa: E402
from benchmarks.harness.records import (append_cache, cache_key, git_info, host_info, load_cache,  # noqa: E402
                                        package_versions)
from benchmarks.scale import page as scale_page  # noqa: E402

DEFAULT_NODES = [250_000, 1_000_000, 2_000_000]
DEFAULT_MODELS = ["gcn", "sage"]
DEFAULT_LAYERS = [8, 16]
FATAL = ("out of memory", "killed", "timeout")  # statuses after which larger graphs are skipped
ASSUMED_BANDWIDTH = 2.7e9  # bytes/s, docs/results/performance.md median (gloo, loopback), if none measured
GRAPH_KEYS = ("blocks", "degree", "features", "classes", "p_in", "seed", "hidden")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", nargs="+", type=int, default=DEFAULT_NODES)
    p.add_argument("--models", nargs="+", choices=["gcn", "sage"], default=DEFAULT_MODELS)
    p.add_argument("--layers", nargs="+", type=int, default=DEFAULT_LAYERS)
    p.add_argument("--modes", nargs="+", choices=scale_page.MODES, default=scale_page.MODES)
    p.add_argument("--epochs", type=int, default=4, help="1 warm-up + the timed ones (median)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--blocks", type=int, default=64, help="SBM blocks (class = block %% classes)")
    p.add_argument("--degree", type=int, default=20)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--p-in", type=float, default=0.8, help="fraction of edges inside a block")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-huge-pages", dest="huge_pages", action="store_false",
                   help="run every mode with THP_MEM_ALLOC_ENABLE=0 (default: 1, torch's transparent huge pages)")
    p.add_argument("--threads-single", type=int, default=2,
                   help="intra-op threads of the single-process modes (2-process modes: 1 per process)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    p.add_argument("--guard-gib", type=float, default=1.5, help="kill a run below this available memory (GiB)")
    p.add_argument("--cache", type=Path, default=HERE / "runs.jsonl")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "results", help="folder of scale.md and scale.png")
    p.add_argument("--force", action="store_true", help="re-measure cached rungs")
    p.add_argument("--retry-failed", action="store_true", help="re-measure cached rungs that did not finish ok")
    p.add_argument("--no-skip", action="store_true", help="run rungs above a failed smaller one")
    p.add_argument("--no-planner", action="store_true", help="do not run the planner's estimate per rung")
    p.add_argument("--page-only", action="store_true", help="only rewrite the page from the cache")
    p.add_argument("--selfcheck", action="store_true", help="check pyg_csr against pyg_edge_index, then exit")
    args = p.parse_args(argv)
    if args.epochs < 2:
        p.error("--epochs must be >= 2 (the first epoch is a warm-up)")
    return args


def config(args: argparse.Namespace, nodes: int, model: str, layers: int, mode: str) -> dict:
    """The parameters that define one run; their JSON is the cache key."""
    return {"nodes": nodes, "model": model, "layers": layers, "mode": mode, "epochs": args.epochs,
            "hidden": args.hidden, "blocks": args.blocks, "degree": args.degree, "features": args.features,
            "classes": args.classes, "p_in": args.p_in, "seed": args.seed,
            "threads_single": args.threads_single, "huge_pages": args.huge_pages}


def same_setup(rec: dict, args: argparse.Namespace) -> bool:
    """Whether a record used this invocation's graph parameters and hidden width."""
    return all(rec.get(k) == getattr(args, k) for k in GRAPH_KEYS)


def skip_reason(records: List[dict], cfg: dict) -> Optional[str]:
    """Why a rung is not worth running: a smaller graph of the same model, depth and mode failed fatally."""
    for rec in records:
        if (rec["nodes"] < cfg["nodes"] and all(rec.get(k) == cfg[k] for k in ("model", "layers", "mode", *GRAPH_KEYS))
                and rec["status"].startswith(FATAL)):
            return f"skipped: {rec['status']} at {rec['nodes']:,} nodes"
    return None


def measure(cfg: dict, args: argparse.Namespace, extra: Optional[dict] = None) -> dict:
    """Run one rung in a fresh, watched worker process and return its record (never raises for a failed run)."""
    run_dir = Path(tempfile.mkdtemp(prefix="scale-run-"))
    spec = {**cfg, **(extra or {})}
    cmd = [sys.executable, "-m", "benchmarks.scale.worker", json.dumps(spec), str(run_dir)]
    host = host_info()
    # torch's transparent huge pages for every mode (the baselines too); the strategies' `huge_pages` keeps the value
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": "1" if cfg["huge_pages"] else "0"}
    watch = run_watched(cmd, run_dir / "log.txt", args.timeout, int(args.guard_gib * GIB), ROOT, env=env)
    host["load_after"] = os.getloadavg()[0]
    result_path = run_dir / "result.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    tail = log_tail(run_dir / "log.txt")
    status = classify(watch, bool(result), tail)
    rec = {**cfg, "key": cache_key(cfg), "status": status, "versions": package_versions(), **result,
           "processes": read_process_peaks(run_dir), "wall_s": watch.pop("wall_s"), "machine": watch,
           "host": host, "git": git_info(), "argv": sys.argv[1:],
           "time": datetime.datetime.now().isoformat(timespec="seconds")}
    if status == "ok":
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        rec.update(error_tail=tail, run_dir=str(run_dir))
    return rec


def one_line(rec: dict) -> str:
    """A progress line for stdout."""
    head = f"{rec['model']} L={rec['layers']} {rec['nodes']:,} nodes {rec['mode']}: {rec['status']}"
    if rec["status"] != "ok" or rec["mode"] == "planner":
        extra = (rec.get("planner") or {}).get("choice", "") if rec["mode"] == "planner" else ""
        return f"{head} {extra} (wall {rec['wall_s']:.0f} s)"
    peak = scale_page.largest_proc_rss(rec)
    return (f"{head}, epoch {rec['epoch_s']:.3f} s, peak RSS {scale_page.gib(peak)} GiB (largest process), "
            f"machine +{scale_page.gib(rec['machine']['used_delta'])} GiB, wall {rec['wall_s']:.0f} s")


def planner_inputs(records: List[dict], cfg: dict) -> Optional[dict]:
    """Per-layer seconds (a measured epoch split evenly over the layers) and bandwidth for the planner."""
    same = {r["mode"]: r for r in records if r["status"] == "ok"
            and all(r.get(k) == cfg[k] for k in cfg if k != "mode")}
    source = next((m for m in ("trainer_single", "pyg_edge_index", "pyg_csr") if m in same), None)
    if source is None:
        return None
    bandwidth = scale_page.median_bandwidth(list(same.values())) or scale_page.median_bandwidth(records)
    return {"planner": {"layer_seconds": [same[source]["epoch_s"] / cfg["layers"]] * cfg["layers"],
                        "seconds_from": source, "bandwidth": bandwidth or ASSUMED_BANDWIDTH,
                        "bandwidth_from": "measured" if bandwidth else "assumed (performance.md median)"}}


def run_ladder(args: argparse.Namespace) -> None:
    """Measure every selected rung missing from the cache (smallest graphs first), appending as it goes."""
    records = load_cache(args.cache)
    done = {r["key"] for r in records if r["status"] == "ok" or not args.retry_failed}
    for nodes in sorted(args.nodes):
        for model in args.models:
            for layers in args.layers:
                modes = list(args.modes) + ([] if args.no_planner else ["planner"])
                for mode in modes:
                    cfg = config(args, nodes, model, layers, mode)
                    if cache_key(cfg) in done and not args.force:
                        continue
                    extra = None
                    if mode == "planner":
                        extra = planner_inputs(records, cfg)
                        if extra is None:
                            continue  # nothing measured to feed it
                    elif not args.no_skip and (why := skip_reason(records, cfg)):
                        print(f"{model} L={layers} {nodes:,} nodes {mode}: {why}", flush=True)
                        continue
                    avail = psutil.virtual_memory().available
                    if avail < args.guard_gib * GIB:
                        print(f"{mode}: not started, only {avail / GIB:.2f} GiB available", flush=True)
                        continue
                    rec = measure(cfg, args, extra)
                    if mode == "planner" and (rec.get("planner") or {}).get("choice") == "n/a":
                        print(f"planner: n/a ({rec['planner'].get('reason')})", flush=True)
                        continue  # not cached: the planner may import again after the refactor
                    append_cache(args.cache, rec)
                    records.append(rec)
                    done.add(rec["key"])
                    print(one_line(rec), flush=True)


def write_page(args: argparse.Namespace) -> str:
    """Fill ``<out>/scale.md``'s generated blocks, ``<out>/notes/scale.md``'s and redraw ``<out>/scale.png`` from the
    records of ``--cache`` with this command's setup (:func:`benchmarks.scale.page.write_page`); another ``--out``
    starts from copies of the docs' page and note. Returns the page."""
    records = [r for r in load_cache(args.cache) if same_setup(r, args)]
    page, notes = args.out / "scale.md", args.out / "notes" / "scale.md"
    for path, source in ((page, scale_page.PAGE), (notes, scale_page.NOTES)):
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source.read_text())
    return scale_page.write_page(page, page.with_suffix(".png"), notes, records)


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    if args.selfcheck:
        from benchmarks.scale import worker as scale_worker

        print("\n".join(scale_worker.selfcheck()))
        return
    if not args.page_only:
        run_ladder(args)
    print(write_page(args))
    print(f"\nwrote {args.out / 'scale.md'} and {args.out / 'scale.png'} from {args.cache}")


if __name__ == "__main__":
    main()
