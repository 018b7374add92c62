"""Per-rank history-table and chunk-graph bytes of hybrid parallelism against G (``S = 2``, ``G = 1, 2``).

Trains one epoch of PyG ``GCN`` on the SBM graph of ``benchmarks/scale/run.py`` with ``GNNPipeStrategy`` (2 stages,
``graph_parallel_size`` G, ``K = 8``, spawn launcher, ``2 G`` processes) and prints, per rank, the bytes it keeps
(the strategy's ``memory/history_bytes/rank<r>`` and ``memory/graph_bytes/rank<r>``) and its peak RSS
(``memory/peak_bytes/rank<r>``), next to what ``1/G`` of the pure pipeline's would be::

    python -m benchmarks.scale.hybrid_memory --nodes 100000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from lightning.pytorch import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule  # noqa: E402
from lightning_gnnpipe.comm.exchange import partition_halos  # noqa: E402
from benchmarks.scale.graph import build_model, sbm  # noqa: E402
from benchmarks.scale.worker import ScaleModule  # noqa: E402

GIB = 2**30


def run(data, G: int, spec: dict) -> dict:
    dm = GraphChunkDataModule(data, num_chunks=8, num_parts=G)
    trainer = Trainer(accelerator="cpu", devices=2 * G, strategy=GNNPipeStrategy(graph_parallel_size=G),
                      max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(ScaleModule(build_model(spec)), datamodule=dm)
    # spawn: rank 0's logged metrics come back to this process
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("memory/")}
    halos = partition_halos(dm.plan, G) if G > 1 else [torch.empty(0)]
    return {"metrics": metrics, "halo_rows": [int(h.numel()) for h in halos]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=100_000)
    p.add_argument("--layers", type=int, default=8)
    args = p.parse_args()
    torch.set_num_threads(1)
    spec = {"model": "gcn", "features": 64, "hidden": 64, "layers": args.layers, "classes": 8, "seed": 0}
    data = sbm(args.nodes)
    res = {G: run(data, G, spec) for G in (1, 2)}
    pipe = res[1]["metrics"]
    print(f"SBM {args.nodes:,} nodes, {int(data.num_edges):,} edges, GCN-{args.layers} hidden 64, S = 2, K = 8 "
          "(MiB; rank = g * S + s)\n")
    print("| G | rank | stage | tables | 1/G of the pipeline's + halo rows | chunk graphs | 1/G of the pipeline's | "
          "peak RSS |")
    print("|---|---|---|---|---|---|---|---|")
    for G, r in res.items():
        m = r["metrics"]
        for rank in range(2 * G):
            s, g = rank % 2, rank // 2
            tables, graph = m[f"memory/history_bytes/rank{rank}"], m[f"memory/graph_bytes/rank{rank}"]
            layers_with_tables = pipe[f"memory/history_bytes/rank{s}"] / (args.nodes * 64 * 4)
            bound = pipe[f"memory/history_bytes/rank{s}"] / G + (layers_with_tables * r["halo_rows"][g] * 64 * 4
                                                                  if G > 1 else 0)
            print(f"| {G} | {rank} | {s} | {tables / 2**20:.1f} | {bound / 2**20:.1f} | {graph / 2**20:.1f} | "
                  f"{pipe[f'memory/graph_bytes/rank{s}'] / G / 2**20:.1f} | "
                  f"{m[f'memory/peak_bytes/rank{rank}'] / GIB:.2f} GiB |")


if __name__ == "__main__":
    main()
