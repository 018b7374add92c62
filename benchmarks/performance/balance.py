"""Slowest pipeline stage: layers cut by equal count vs by measured time (``balance="time"``).

A 16-layer GCN on Cora (1433 input features, hidden 64): the first layer maps 1433 features,
the other fifteen 64, so equal layer counts give the first stage most of the work. For each
split the script builds the real stage modules (``GNNStage``) in one process and measures each
stage's forward+backward over all ``K`` chunks of one training step, one thread (as one
process per stage gets on a 2-core machine), best of ``--repeats`` runs. A GPipe step lasts about
``(K + S - 1) / K`` times the slowest stage's time, so that time is what balancing must lower.

Run from the repository root:

    python -m benchmarks.performance.balance                     # S = 2 and 4 stages, K = 8 chunks
    python -m benchmarks.performance.balance --stages 2 --repeats 9
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from torch_geometric.nn.models import GCN  # noqa: E402

from lightning_gnnpipe import build_chunk_plan, find_layer_stack  # noqa: E402
from lightning_gnnpipe.datasets import load_planetoid  # noqa: E402
from lightning_gnnpipe.nn.stack import infer_dims  # noqa: E402
from lightning_gnnpipe.pipeline.balance import balanced_split, profile_layer_costs  # noqa: E402
from lightning_gnnpipe.data.chunk_graph import build_chunk_graph
from lightning_gnnpipe.nn.gcn_norm import norm_keys  # noqa: E402
from lightning_gnnpipe.pipeline.split import split_layers  # noqa: E402
from lightning_gnnpipe.pipeline.stage import GNNStage  # noqa: E402


class StageTimer:
    """One stage's module and inputs; ``run()`` times one step's forward+backward of all chunks."""

    def __init__(self, blocks, layers: List[int], dims, plan, data) -> None:
        graph = build_chunk_graph(plan, data.edge_index, norm_keys([blocks[i] for i in layers]), torch.device("cpu"))
        self.stage = GNNStage([blocks[i] for i in layers], layers, dims, graph, x=data.x if 0 in layers else None)
        m = plan.max_chunk_size
        x_pad = plan.pad(data.x)
        self.inputs = [x_pad[c * m:(c + 1) * m] if 0 in layers else torch.randn(m, dims[layers[0]])
                       for c in range(plan.num_chunks)]
        self.first = 0 in layers

    def run(self) -> float:
        inputs = [h if self.first else h.clone().requires_grad_(True) for h in self.inputs]
        start = time.perf_counter()
        for c, h in enumerate(inputs):  # every chunk's forward and backward through this stage
            out = self.stage(h, chunk_id=torch.tensor([c]))
            out.backward(torch.ones_like(out))
        seconds = time.perf_counter() - start
        for p in self.stage.parameters():
            p.grad = None
        return seconds


def best_times(timers: List[StageTimer], repeats: int) -> List[float]:
    """Fastest of ``repeats`` runs of each timer, run round-robin so that load bursts hit all alike."""
    times: List[List[float]] = [[] for _ in timers]
    for r in range(repeats + 1):
        for i, timer in enumerate(timers):
            seconds = timer.run()
            if r > 0:
                times[i].append(seconds)
    return [min(t) for t in times]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--stages", type=int, nargs="+", default=[2, 4])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data = load_planetoid("Cora")
    gnn = GCN(data.num_features, args.hidden, args.layers, int(data.y.max()) + 1)
    blocks = find_layer_stack(gnn).blocks
    dims = infer_dims(blocks, data.x[:2])
    plan = build_chunk_plan(data.edge_index, data.num_nodes, args.chunks)
    costs = profile_layer_costs(blocks, plan, data.edge_index, data.x)
    print(f"Cora, GCN {data.num_features}->{args.hidden}x{args.layers - 1}->{dims[-1]}, {args.chunks} chunks, "
          f"{args.threads} thread(s), best of {args.repeats} steps")
    print("profiled layer cost on one chunk (ms):", [round(1e3 * c, 2) for c in costs])
    print(f"{'S':>2} {'balance':>7}  {'stage -> layers':<44} {'stage time per step (ms)':<34} {'slowest':>8}")
    for s in args.stages:
        splits = {"count": split_layers(args.layers, s), "time": balanced_split(costs, s)}
        timers = {name: [StageTimer(blocks, layers, dims, plan, data) for layers in split]
                  for name, split in splits.items()}
        measured = best_times(timers["count"] + timers["time"], args.repeats)
        seconds = {"count": measured[:s], "time": measured[s:]}
        for name, split in splits.items():
            runs = ", ".join(f"{r[0]}-{r[-1]}" for r in split)
            ms = ", ".join(f"{1e3 * t:.1f}" for t in seconds[name])
            print(f"{s:>2} {name:>7}  [{runs}]{'':<{42 - len(runs)}} [{ms}]{'':<{32 - len(ms)}} "
                  f"{1e3 * max(seconds[name]):>8.1f}")
        print(f"{s:>2} slowest stage, time / count: {max(seconds['time']) / max(seconds['count']):.2f}")

if __name__ == "__main__":
    main()
