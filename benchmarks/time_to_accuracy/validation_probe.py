"""Where GNNPipe's exact validation goes, two probes quoted on docs/results/time_to_accuracy.md:

    python -m benchmarks.time_to_accuracy.validation_probe             # probes 1 and 2
    python -m benchmarks.time_to_accuracy.validation_probe --model gcnii16  # probe 2 with GCNII-16
    python -m benchmarks.time_to_accuracy.validation_probe --part fit  # probe 3
    python -m benchmarks.time_to_accuracy.validation_probe --part fit --allocator glibc  # probe 3, glibc's heap
    python -m benchmarks.time_to_accuracy.validation_probe --part threads [--nodes 1000000]  # probe 4

1. A rank waiting in gloo's ``recv`` while the other computes with 2 threads: its CPU seconds (does waiting cost a
   core the computing stage could use?).
2. The exact forward of residual GraphSAGE-8 (``--model gcnii16``: GCNII-16) on the 300k community graph, in one
   process with 2 threads: the single process's whole-graph CSR forward against the two GNNPipe stages'
   ``forward_full`` (K = 8), median of 3.
3. The same in a fit's processes: ``Trainer.validate`` three times under ``GNNPipeStrategy(start_method="popen",
   evaluation="pipeline")`` (2 processes), each rank's ``GNNStage.forward_full`` and ``PipelineRuntime.full_forward``
   seconds, and the stage's CPU seconds in user and kernel mode (``getrusage``). Rank 1, which the strategy starts,
   runs with the strategy's allocator settings (torch's transparent huge pages, a 16 MiB glibc mmap threshold);
   ``--allocator glibc`` starts it with neither (``huge_pages=False, heap_mmap_threshold=None``). Rank 0 is the
   process that calls ``validate``, which the strategy never changes.
4. The single process's exact forward of residual GraphSAGE-8 (the benchmark's ``exact`` mode: whole-graph CSR,
   torch's transparent huge pages) on 1 and on 2 intra-op threads, alternating, 3 calls each time: what one thread
   does in the time of two (graph-parallel evaluation gives each of 2 ranks half the rows and one core).
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.harness.process import free_port  # noqa: E402


def _work() -> float:
    a = torch.randn(1500, 1500)
    t0 = time.perf_counter()
    for _ in range(60):
        a = torch.tanh(a @ a / 1500)
    return time.perf_counter() - t0


def _rank(r: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=r, world_size=2)
    buf = torch.zeros(10)
    dist.barrier()
    if r == 0:
        torch.set_num_threads(2)
        print(f"wait probe: rank 0 computes with 2 threads for {_work():.2f} s", flush=True)
        dist.send(buf, 1)
    else:
        cpu, wall = time.process_time(), time.perf_counter()
        dist.recv(buf, 0)
        print(f"wait probe: rank 1 waited {time.perf_counter() - wall:.2f} s in recv, using "
              f"{time.process_time() - cpu:.2f} s of CPU", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def _median(fn, reps: int = 3) -> float:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def forward_probe(name: str = "ressage8") -> None:
    from benchmarks.time_to_accuracy.graph import GraphSpec, community_graph
    from benchmarks.time_to_accuracy.models import build_model
    from benchmarks.time_to_accuracy.worker import exact_adjacency
    from lightning_gnnpipe import build_chunk_plan, find_layer_stack
    from lightning_gnnpipe.data.chunk_graph import build_chunk_graph
    from lightning_gnnpipe.nn.chunk_call import chunk_graph_options
    from lightning_gnnpipe.nn.gcn_norm import norm_keys
    from lightning_gnnpipe.nn.stack import infer_dims
    from lightning_gnnpipe.pipeline.split import split_layers
    from lightning_gnnpipe.pipeline.stage import GNNStage

    torch.set_num_threads(2)
    data = community_graph(GraphSpec(num_nodes=300_000))
    n = data.num_nodes
    model = build_model(name, data.num_features, int(data.y.max()) + 1, 0).eval()
    plan = build_chunk_plan(data.edge_index, n, 8)
    blocks = find_layer_stack(model).blocks
    dims = infer_dims(blocks, data.x[:2])
    x0 = name == "gcnii16"  # GCNII: the later stage computes x0 with its copy of block 0 (pipeline/initial_embedding)
    stages = []
    for layers in split_layers(len(blocks), 2):
        own = [blocks[i] for i in layers]
        graph = build_chunk_graph(plan, data.edge_index, norm_keys(own), torch.device("cpu"),
                                  **chunk_graph_options(own))
        extra = {"carry_x0": True, "x0_block": None if 0 in layers else blocks[0]} if x0 else {}
        stages.append(GNNStage(own, layers, dims, graph, x=data.x if 0 in layers or x0 else None, **extra))
    with torch.no_grad():
        h = stages[0].forward_full(data.x)
        first = _median(lambda: stages[0].forward_full(data.x))
        last = _median(lambda: stages[1].forward_full(*(h if isinstance(h, tuple) else (h,))))
        csr = exact_adjacency(model, name, data)  # the benchmark's exact mode (after the stages: it changes the convs)
        exact = _median(lambda: model(data.x, csr))
    print(f"forward probe ({name}): whole-graph CSR forward {exact:.2f} s; GNNPipe stage 0 {first:.2f} s + stage 1 "
          f"{last:.2f} s = {first + last:.2f} s (2 threads, one process)", flush=True)


def fit_probe(allocator: str = "default") -> None:
    import json

    from lightning.pytorch import Trainer

    from benchmarks.time_to_accuracy.graph import GraphSpec, community_graph
    from benchmarks.time_to_accuracy.models import LEARNING_RATE, Classifier, build_model
    from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule
    from lightning_gnnpipe.pipeline import runtime, stage

    from benchmarks.time_to_accuracy.worker import cpu_since

    seconds = {}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t0, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            out = fn(*args, **kwargs)
            used = cpu_since(cpu)
            seconds.setdefault(name, []).append(round(time.perf_counter() - t0, 2))
            seconds.setdefault(name + " user/kernel CPU s", []).append(
                (round(used["user_s"], 2), round(used["sys_s"], 2)))
            return out
        return wrapper

    stage.GNNStage.forward_full = timed("stage forward_full", stage.GNNStage.forward_full)
    runtime.PipelineRuntime.full_forward = timed("pipeline full_forward", runtime.PipelineRuntime.full_forward)
    data = community_graph(GraphSpec(num_nodes=300_000))
    module = Classifier(build_model("ressage8", data.num_features, int(data.y.max()) + 1, 0),
                        LEARNING_RATE["ressage8"])
    options = {} if allocator == "default" else {"huge_pages": False, "heap_mmap_threshold": None}
    strategy = GNNPipeStrategy(start_method="popen", evaluation="pipeline", **options)
    trainer = Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=1)
    for _ in range(3):
        trainer.validate(module, datamodule=GraphChunkDataModule(data, num_chunks=8), verbose=False)
    print(f"fit probe ({allocator} allocator): rank {trainer.global_rank}: {json.dumps(seconds)}", flush=True)


def threads_probe(nodes: int) -> None:
    from benchmarks.time_to_accuracy.graph import GraphSpec, community_graph
    from benchmarks.time_to_accuracy.models import build_model
    from benchmarks.time_to_accuracy.worker import exact_adjacency

    data = community_graph(GraphSpec(num_nodes=nodes))
    model = build_model("ressage8", data.num_features, int(data.y.max()) + 1, 0).eval()
    csr = exact_adjacency(model, "ressage8", data)
    seconds: dict = {1: [], 2: []}
    with torch.no_grad():
        model(data.x, csr)
        for threads in (2, 1, 2, 1):
            torch.set_num_threads(threads)
            seconds[threads] += [_median(lambda: model(data.x, csr), reps=1) for _ in range(3)]
    one, two = statistics.median(seconds[1]), statistics.median(seconds[2])
    print(f"threads probe ({nodes:,} nodes, ressage8, exact forward): 1 thread {min(seconds[1]):.2f}-"
          f"{max(seconds[1]):.2f} s, 2 threads {min(seconds[2]):.2f}-{max(seconds[2]):.2f} s; medians' ratio "
          f"{one / two:.2f}x", flush=True)


if __name__ == "__main__":
    if sys.argv[1:3] == ["--part", "threads"]:
        if os.environ.get("THP_MEM_ALLOC_ENABLE") != "1":  # torch reads it at start: the exact mode's setting
            os.execve(sys.executable, [sys.executable, "-m", "benchmarks.time_to_accuracy.validation_probe",
                                       *sys.argv[1:]], {**os.environ, "THP_MEM_ALLOC_ENABLE": "1"})
        threads_probe(int(sys.argv[4]) if sys.argv[3:4] == ["--nodes"] else 1_000_000)
    elif sys.argv[1:3] == ["--part", "fit"]:
        fit_probe("glibc" if sys.argv[3:] == ["--allocator", "glibc"] else "default")
    elif sys.argv[1:2] == ["--model"]:
        forward_probe(sys.argv[2])
    else:
        mp.spawn(_rank, args=(free_port(),), nprocs=2)
        forward_probe()
