"""Graphs larger than one machine: an emulated cluster of memory-capped machines trains a graph that one capped
process cannot. One command, records cached in ``benchmarks/large_graphs/runs.jsonl``, the page
``docs/large_graphs.md`` written from them::

    python -m benchmarks.large_graphs.bench --nodes 1600000 --single-nodes 500000 600000   # as root (cgroups)
    python -m benchmarks.large_graphs.bench --page-only

For a graph of ``--nodes`` (the learnable community graph of :mod:`benchmarks.time_to_accuracy.graph`, average
degree 20, with ``p_in = 0.84`` so that METIS's 2-way cut is a few percent):

1. the graph is generated and ``torch.save``d, as a user holds it;
2. ``lightning-gnnpipe partition`` cuts it (``G = 2``, ``K = 8`` for the hybrid; ``G = K = 4`` for graph
   parallelism), its seconds and peak memory recorded; METIS (pymetis) and KaMinPar are compared on it
   (:mod:`benchmarks.large_graphs.partitioners`);
3. the CSR single process (:mod:`benchmarks.large_graphs.single`) runs under one cap (``--cap-gib``, default 5), at
   ``--nodes`` (its OOM shown) and at ``--single-nodes`` (the largest size it trains, the smallest it cannot), and
   uncapped at ``--nodes`` (its peak and accuracy, the reference);
4. ``--machines`` (4) machines, each a memory cgroup with that cap (:mod:`benchmarks.large_graphs.cluster`) running
   one torchrun agent (``--nnodes 4 --node-rank r``, rendezvous on 127.0.0.1), train ``ressage8`` from the
   partitions: hybrid 2 x 2 (``GNNPipeStrategy(graph_parallel_size=2)``) and ``GraphParallelStrategy`` with
   ``G = 4``, ``--epochs`` epochs with validation. Recorded: every machine's ``memory.max_usage_in_bytes``, OOM kills,
   every rank's USS/PSS/RSS peak, the agents' memory, the accuracy per epoch.

Needs root and cgroup v1's memory controller. At 1.6M nodes on 2 cores the whole run takes about 40 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.harness.records import append_cache, host_info, load_cache  # noqa: E402
from benchmarks.harness.process import free_port  # noqa: E402
from benchmarks.large_graphs.cluster import Machine  # noqa: E402
from benchmarks.large_graphs.page import latest  # noqa: E402

RECORDS = Path(__file__).with_name("runs.jsonl")
GIB = 2**30
GRAPH = {"avg_degree": 20, "p_in": 0.84, "p_near": 0.12}  # METIS 2-way cut 0.02-0.03


def env() -> dict:
    """The ranks' environment: the strategy's allocator defaults set where torchrun starts them."""
    return dict(os.environ, PYTHONPATH=str(ROOT), THP_MEM_ALLOC_ENABLE="1", MALLOC_MMAP_THRESHOLD_=str(16 * 2**20),
                PYTHONWARNINGS="ignore")


def graph_file(work: Path, nodes: int, records: List[dict]) -> Path:
    path = work / f"graph_{nodes}.pt"
    if path.exists():
        return path
    from benchmarks.time_to_accuracy.graph import GraphSpec, community_graph

    t0 = time.perf_counter()
    data = community_graph(GraphSpec(num_nodes=nodes, **GRAPH))
    gen_s = time.perf_counter() - t0
    torch.save(data, path)
    rec = {"kind": "graph", "nodes": nodes, "edges": int(data.edge_index.size(1)), "generate_s": gen_s,
           "file_bytes": path.stat().st_size, "spec": GRAPH}
    if not latest(records, kind="graph", nodes=nodes):
        append_cache(RECORDS, rec)
        records.append(rec)
    print(f"graph: {nodes:,} nodes, {rec['edges']:,} edges in {gen_s:.0f} s", flush=True)
    return path


def partition(work: Path, graph: Path, nodes: int, G: int, K: int, records: List[dict]) -> Path:
    out = work / f"parts_{nodes}_g{G}_k{K}"
    rec = latest(records, kind="partition", nodes=nodes, G=G, K=K)
    if out.exists() and rec:
        return out
    subprocess.run(["rm", "-rf", str(out)], check=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "lightning_gnnpipe.cli", "partition", "--data", str(graph), "--num-parts",
                    str(G), "--num-chunks", str(K), "--out", str(out)], check=True, env=env(), cwd=ROOT)
    meta = json.loads((out / "META.json").read_text())
    rec = {"kind": "partition", "nodes": nodes, "G": G, "K": K, "wall_s": time.perf_counter() - t0,
           **{k: meta[k] for k in ("num_edges", "seconds", "peak_bytes", "peak_bytes_per_million_edges", "edge_cut",
                                   "partition_edge_cut", "parts")},
           "bytes": sum(r["bytes"] for r in meta["files"].values())}
    append_cache(RECORDS, rec)
    records.append(rec)
    return out


def partitioners(work: Path, graph: Path, nodes: int, records: List[dict]) -> None:
    for method in ("pymetis", "kaminpar"):
        for parts in (2, 8):
            if latest(records, kind="partitioner", nodes=nodes, method=method, parts=parts):
                continue
            out = work / f"partitioner_{method}_{parts}.json"
            subprocess.run([sys.executable, "-m", "benchmarks.large_graphs.partitioners", str(graph), method,
                            str(parts), str(out)], check=True, env=env(), cwd=ROOT)
            rec = {"kind": "partitioner", "nodes": nodes, **json.loads(out.read_text())}
            append_cache(RECORDS, rec)
            records.append(rec)
            print(f"partitioner {method} {parts}: {rec['total_s']:.1f} s, cut {rec['edge_cut']:.4f}", flush=True)


def single(work: Path, graph: Path, nodes: int, cap: Optional[int], epochs: int, records: List[dict]) -> None:
    if latest(records, kind="single", nodes=nodes, cap_bytes=cap, epochs=epochs):
        return
    out = work / f"single_{nodes}_{cap}.json"
    out.unlink(missing_ok=True)
    machine = Machine("gnnpipe_single", cap)
    try:
        t0 = time.perf_counter()
        proc = machine.start([sys.executable, "-m", "benchmarks.large_graphs.single", str(graph), str(epochs),
                              str(out)], work / f"single_{nodes}_{cap}.log", env())
        code = proc.wait()
        rec = {"kind": "single", "nodes": nodes, "cap_bytes": cap, "epochs": epochs, "exitcode": code,
               "wall_s": time.perf_counter() - t0, "machine_peak_bytes": machine.peak_bytes(),
               "oom_kills": machine.oom_kills()}
    finally:
        machine.remove()
    mem = out.with_suffix(".mem.json")
    rec["peaks"] = json.loads(mem.read_text()) if mem.exists() else None  # flushed every second, also when killed
    if out.exists():
        rec.update(json.loads(out.read_text()))
    append_cache(RECORDS, rec)
    records.append(rec)
    print(f"single {nodes:,} cap {cap}: exit {code}, machine peak {rec['machine_peak_bytes'] / GIB:.2f} GiB, "
          f"OOM kills {rec['oom_kills']}", flush=True)


def cluster(work: Path, parts: Path, nodes: int, mode: str, machines: int, cap: int, epochs: int,
            records: List[dict]) -> None:
    if latest(records, kind="cluster", nodes=nodes, mode=mode, machines=machines, cap_bytes=cap, epochs=epochs):
        return
    out = work / f"cluster_{nodes}_{mode}"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir(parents=True)
    port = free_port()
    boxes = [Machine(f"gnnpipe_machine{r}", cap) for r in range(machines)]
    try:
        t0 = time.perf_counter()
        procs = [box.start([sys.executable, "-m", "torch.distributed.run", "--nnodes", str(machines),
                            "--nproc-per-node", "1", "--node-rank", str(r), "--master-addr", "127.0.0.1",
                            "--master-port", str(port), str(ROOT / "benchmarks/large_graphs/job.py"), str(parts),
                            mode, str(epochs), str(out)], out / f"machine{r}.log", env())
                 for r, box in enumerate(boxes)]
        codes = [p.wait() for p in procs]
        rec = {"kind": "cluster", "nodes": nodes, "mode": mode, "machines": machines, "cap_bytes": cap,
               "epochs": epochs, "parts": str(parts.name), "exitcodes": codes, "wall_s": time.perf_counter() - t0,
               "machine_peak_bytes": [b.peak_bytes() for b in boxes], "oom_kills": [b.oom_kills() for b in boxes]}
    finally:
        for b in boxes:
            b.remove()

    def read(name: str):
        path = out / name
        return json.loads(path.read_text()) if path.exists() else None

    rec["rank_peaks"] = [read(f"mem_rank{r}.json") for r in range(machines)]
    rec["agents"] = [read(f"agent_rank{r}.json") for r in range(machines)]
    ranks = [read(f"epochs_rank{r}.json") for r in range(machines)]
    if ranks[0]:
        rec["epochs_rows"] = [dict(row, train_s=max(r[e]["train_s"] for r in ranks if r),
                                   val_s=max(r[e]["val_s"] for r in ranks if r)) for e, row in enumerate(ranks[0])]
    append_cache(RECORDS, rec)
    records.append(rec)
    print(f"cluster {mode} {nodes:,}: exits {codes}, machine peaks "
          f"{[round(b / GIB, 2) for b in rec['machine_peak_bytes']]} GiB, OOM kills {rec['oom_kills']}", flush=True)


def idle(records: List[dict]) -> None:
    if latest(records, kind="idle"):
        return
    code = "import torch, psutil; m = psutil.Process().memory_full_info(); print(m.uss, m.rss)"
    uss, rss = map(int, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                       check=True).stdout.split())
    rec = {"kind": "idle", "uss": uss, "rss": rss}
    append_cache(RECORDS, rec)
    records.append(rec)


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=1_600_000)
    p.add_argument("--single-nodes", type=int, nargs="*", default=[500_000, 600_000],
                   help="sizes the single process runs under the cap (the largest it trains, the smallest it cannot)")
    p.add_argument("--partition-nodes", type=int, nargs="*", default=[1_000_000],
                   help="further sizes that are only partitioned (G = 2, K = 8): the partitioner's figures")
    p.add_argument("--check-nodes", type=int, nargs="*", default=[20_000, 600_000],
                   help="smaller sizes the capped machines also train (2 epochs): the check of the per-rank estimate")
    p.add_argument("--machines", type=int, default=4)
    p.add_argument("--cap-gib", type=float, default=5.0)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--work", default="/tmp/gnnpipe-large", help="graphs, partitions and logs (GBs)")
    p.add_argument("--skip", nargs="*", default=[], choices=["partitioners", "single", "hybrid", "graph_parallel",
                                                             "reference"])
    p.add_argument("--page-only", action="store_true")
    p.add_argument("--records", default=None, help="the record file (a pilot run: another one, no page)")
    args = p.parse_args(argv)
    global RECORDS
    RECORDS = Path(args.records) if args.records else Path(__file__).with_name("runs.jsonl")
    records = load_cache(RECORDS)
    if not args.page_only:
        work = Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
        cap = int(args.cap_gib * GIB)
        if not latest(records, kind="host"):
            rec = {"kind": "host", **host_info()}
            append_cache(RECORDS, rec)
            records.append(rec)
        idle(records)
        graph = graph_file(work, args.nodes, records)
        hybrid_parts = partition(work, graph, args.nodes, 2, 8, records)
        gp_parts = partition(work, graph, args.nodes, args.machines, args.machines, records)
        for nodes in args.partition_nodes:
            partition(work, graph_file(work, nodes, records), nodes, 2, 8, records)
        if "partitioners" not in args.skip:
            partitioners(work, graph, args.nodes, records)
        if "single" not in args.skip:
            single(work, graph, args.nodes, cap, 1, records)  # its OOM under the cap
            for nodes in args.single_nodes:
                single(work, graph_file(work, nodes, records), nodes, cap, 1, records)
        if "hybrid" not in args.skip:
            cluster(work, hybrid_parts, args.nodes, "hybrid", args.machines, cap, args.epochs, records)
        if "graph_parallel" not in args.skip:
            cluster(work, gp_parts, args.nodes, "graph_parallel", args.machines, cap, args.epochs, records)
        for nodes in args.check_nodes:
            small = graph_file(work, nodes, records)
            for mode, G, K in (("hybrid", 2, 8), ("graph_parallel", args.machines, args.machines)):
                if mode not in args.skip:
                    cluster(work, partition(work, small, nodes, G, K, records), nodes, mode, args.machines, cap, 2,
                            records)
        if "reference" not in args.skip:
            single(work, graph, args.nodes, None, args.epochs, records)  # uncapped: peak and accuracy
    if RECORDS == Path(__file__).with_name("runs.jsonl"):
        from benchmarks.large_graphs.page import write_page

        print(write_page(load_cache(RECORDS)))


if __name__ == "__main__":
    main()
