"""Side by side: single device, graph parallelism and GNNPipe on the same model and kernels.

Prints markdown tables of bytes per epoch (measured and analytic), epoch time (median of the
epochs after the first), communication wait, pipeline bubble, peak memory per process, and
the GNNPipe / graph-parallel ratios. Not a test: run it by hand, e.g.

    python -m benchmarks.performance.parallelism --datasets cora --layers 4 8 16 32 --procs 2 --json out.json
    python -m benchmarks.performance.parallelism --analytic-only --datasets cora tolokers cornell5 sbm --procs 2 4

Every run is a real ``Trainer.fit`` of a PyG ``GCN`` (hidden 128 by default, Adam, one
full-graph step per epoch, no validation). Graph parallelism uses ``G = procs`` METIS parts;
GNNPipe uses ``S = procs`` stages and ``K = chunks_per_stage * S`` chunks; hybrid uses ``G = 2`` partitions x
``S = procs / 2`` stages and ``K = chunks_per_stage * S * G`` chunks (4 processes and more). The threads of the
machine are split evenly between the processes (``torch.set_num_threads``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import List

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, Trainer
from torch_geometric.data import Data
from torch_geometric.nn.models import GCN
from torch_geometric.utils import coalesce, to_undirected

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, GraphParallelStrategy  # noqa: E402
from benchmarks.scale.graph import split_masks  # noqa: E402
from lightning_gnnpipe.comm.accounting import KINDS  # noqa: E402
from lightning_gnnpipe import find_layer_stack  # noqa: E402
from lightning_gnnpipe.planner.volume import graph_parallel_volume, hybrid_volume, pipeline_volume  # noqa: E402
from lightning_gnnpipe.data.partition import nested_partition  # noqa: E402
from lightning_gnnpipe.pipeline.split import split_layers  # noqa: E402
from lightning_gnnpipe.data.chunk import build_chunk_plan  # noqa: E402
from tests.helpers import GCNModule  # noqa: E402  (an ordinary PyG LightningModule, as a user writes it)

CORES = os.cpu_count() or 1
HYBRID_PARTS = 2  # G of the hybrid mode


def sbm(num_nodes: int = 200_000, num_blocks: int = 20, avg_degree: int = 10, num_features: int = 128,
        p_in: float = 0.8, seed: int = 0) -> Data:
    """A sparse stochastic-block-model graph in ``O(|E|)`` (PyG's generator is ``O(|V|^2)``).

    Each of ``|V| * avg_degree / 2`` undirected edges starts at a uniform node and ends, with
    probability ``p_in``, at a uniform node of the same block, else at a uniform node.
    """
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(num_nodes) * num_blocks // num_nodes
    size = num_nodes // num_blocks
    e = num_nodes * avg_degree // 2
    src = torch.randint(num_nodes, (e,), generator=g)
    same = torch.rand(e, generator=g) < p_in
    dst = torch.where(same, (y[src] * size + torch.randint(size, (e,), generator=g)).clamp_max(num_nodes - 1),
                      torch.randint(num_nodes, (e,), generator=g))
    keep = src != dst
    edge_index = coalesce(to_undirected(torch.stack([src[keep], dst[keep]]), num_nodes=num_nodes))
    x = torch.randn(num_nodes, num_features, generator=g) + F.one_hot(y % num_features, num_features).float()
    masks = split_masks(num_nodes, g)
    return Data(x=x, edge_index=edge_index, y=y, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])


def load(name: str, sbm_nodes: int) -> Data:
    from lightning_gnnpipe import datasets

    if name == "cora":
        return datasets.load_planetoid("Cora")
    if name == "tolokers":
        return datasets.load_tolokers()
    if name == "cornell5":
        return datasets.load_cornell5()
    if name == "sbm":
        return sbm(sbm_nodes)
    raise ValueError(f"parallelism.py: unknown dataset {name!r}. Use cora, tolokers, cornell5 or sbm.")


def peak_rss_mib() -> float:
    """Peak resident memory of this process in MiB (``VmHWM``; ``ru_maxrss`` would include the
    parent's peak, which a spawned child inherits across ``exec`` on Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Probe(Callback):
    """Per rank: epoch wall times, the logged comm metrics, peak RSS; written to ``<dir>/rank<r>.json``."""

    def __init__(self, directory: str, threads: int) -> None:
        self.directory, self.threads = directory, threads
        self.epochs: List[dict] = []

    def setup(self, trainer, pl_module, stage):
        torch.set_num_threads(self.threads)
        self.bandwidth = None
        if trainer.world_size > 1:  # the process group exists here; every rank takes part
            from lightning_gnnpipe.planner.cost import measure_bandwidth

            self.bandwidth = measure_bandwidth(device=trainer.strategy.root_device)

    def on_train_epoch_start(self, trainer, pl_module):
        self._t0 = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module):
        row = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("comm/")}
        row["epoch_s"] = time.perf_counter() - self._t0
        self.epochs.append(row)

    def on_fit_end(self, trainer, pl_module):
        peak = peak_rss_mib()
        Path(self.directory).mkdir(parents=True, exist_ok=True)
        (Path(self.directory) / f"rank{trainer.global_rank}.json").write_text(
            json.dumps({"epochs": self.epochs, "peak_rss_mib": peak, "bandwidth_Bps": self.bandwidth}))


def run(data: Data, mode: str, procs: int, layers: int, hidden: int, epochs: int, chunks_per_stage: int) -> dict:
    """Fit ``epochs`` epochs in one mode and summarise the measurements."""
    devices = 1 if mode == "single" else procs
    parts = HYBRID_PARTS if mode == "hybrid" else 1
    chunks = {"single": 1, "graph_parallel": procs, "gnnpipe": chunks_per_stage * procs,
              "hybrid": chunks_per_stage * procs}[mode]
    dm = GraphChunkDataModule(data, num_chunks=chunks, num_parts=parts)
    strategy = {"single": "auto", "graph_parallel": GraphParallelStrategy(), "gnnpipe": GNNPipeStrategy(),
                "hybrid": GNNPipeStrategy(graph_parallel_size=parts)}[mode]
    directory = tempfile.mkdtemp(prefix="gnnpipe-bench-")
    module = GCNModule(data.num_features, hidden, layers, int(data.y.max()) + 1)
    trainer = Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_epochs=epochs, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, limit_val_batches=0,
                      callbacks=[Probe(directory, max(1, CORES // devices))])
    trainer.fit(module, datamodule=dm)
    ranks = [json.loads((Path(directory) / f"rank{r}.json").read_text()) for r in range(devices)]
    timed = ranks[0]["epochs"][1:] or ranks[0]["epochs"]
    out = {"mode": mode, "procs": devices, "layers": layers, "chunks": chunks,
           "epoch_s": statistics.median(e["epoch_s"] for e in timed),
           "peak_rss_mib": [r["peak_rss_mib"] for r in ranks], "bandwidth_Bps": ranks[0].get("bandwidth_Bps")}
    if mode != "single":
        last = ranks[0]["epochs"][-1]
        out["sent"] = {k: int(last[f"comm/sent/{k}"]) for k in KINDS}
        for key in ("wait_s", "bubble_s", "compute_s", "step_s"):
            out[key] = [statistics.median(e[f"comm/{key}/rank{r}"] for e in timed) for r in range(devices)]
        dims = [data.num_features] + [hidden] * (layers - 1) + [int(data.y.max()) + 1]
        params = sum(p.numel() for p in module.parameters())
        if mode in ("gnnpipe", "hybrid"):
            stages = procs // parts
            blocks = find_layer_stack(module).blocks
            flat = [sum(p.numel() + 1 for i in st for p in blocks[i].parameters()) for st in split_layers(layers, stages)]
            out["analytic"] = hybrid_volume(dm.plan, dims, stages, parts, [True] * layers, flat)
            out["minimum"] = sum(hybrid_volume(dm.plan, dims, stages, parts, [True] * layers, flat,
                                               minimum=True).values())
        else:
            out["analytic"] = graph_parallel_volume(dm.plan, dims, [True] * layers, params,
                                                    len(list(module.parameters())))
            out["minimum"] = sum(out["analytic"].values())
    return out


def analytic_rows(data: Data, name: str, procs: List[int], layers: List[int], hidden: int,
                  chunks_per_stage: int) -> List[dict]:
    """Bytes per epoch from the formulas for every (procs, layers), without training."""
    rows = []
    classes = int(data.y.max()) + 1
    for p in procs:
        parts = build_chunk_plan(data.edge_index, data.num_nodes, p)
        chunks = build_chunk_plan(data.edge_index, data.num_nodes, chunks_per_stage * p)
        nested = None
        if p >= 2 * HYBRID_PARTS:
            k = chunks_per_stage * p
            nested = build_chunk_plan(data.edge_index, data.num_nodes, k, part=nested_partition(
                data.edge_index, data.num_nodes, HYBRID_PARTS, k // HYBRID_PARTS))
        for L in layers:
            dims = [data.num_features] + [hidden] * (L - 1) + [classes]
            params = sum(x.numel() for x in GCN(data.num_features, hidden, L, classes).parameters())
            gp = sum(graph_parallel_volume(parts, dims, [True] * L, params, 2 * L).values())
            pipe = sum(pipeline_volume(chunks, dims, p).values())
            row = {"dataset": name, "procs": p, "layers": L, "halo": sum(int(h.numel()) for h in parts.halo),
                   "gp_bytes": gp, "pipe_bytes": pipe, "ratio": gp / pipe}
            if nested is not None:
                s = p // HYBRID_PARTS
                row["hybrid_bytes"] = sum(hybrid_volume(nested, dims, s, HYBRID_PARTS, [True] * L,
                                                        [(params + 2 * L) // s] * s).values())
            rows.append(row)
    return rows


def mib(b: float) -> str:
    return f"{b / 2**20:,.2f}"


def print_tables(analytic: List[dict], measured: List[dict]) -> None:
    if analytic:
        print("\n### Bytes per epoch from the formulas (all ranks, MiB)\n")
        print("| dataset | procs | L | halo H | graph-parallel | GNNPipe | hybrid 2 x P/2 | GP/GNNPipe |")
        print("|---|---|---|---|---|---|---|---|")
        for r in analytic:
            hyb = mib(r["hybrid_bytes"]) if "hybrid_bytes" in r else "-"
            print(f"| {r['dataset']} | {r['procs']} | {r['layers']} | {r['halo']:,} | {mib(r['gp_bytes'])} | "
                  f"{mib(r['pipe_bytes'])} | {hyb} | {r['ratio']:.2f} |")
    if measured:
        print("\n### Measured runs\n")
        print("| dataset | mode | procs | K | L | epoch s | sent MiB | analytic MiB | meas/min | wait s (max rank) "
              "| bubble frac (mean) | peak RSS MiB (max) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in measured:
            sent = sum(r["sent"].values()) if "sent" in r else 0
            ana = sum(r["analytic"].values()) if "analytic" in r else 0
            bub = (statistics.mean(b / s for b, s in zip(r["bubble_s"], r["step_s"])) if "bubble_s" in r else 0)
            print(f"| {r['dataset']} | {r['mode']} | {r['procs']} | {r['chunks']} | {r['layers']} | "
                  f"{r['epoch_s']:.3f} | {mib(sent)} | {mib(ana)} | "
                  f"{sent / r['minimum'] if r.get('minimum') else 0:.3f} | {max(r.get('wait_s', [0])):.3f} | "
                  f"{bub:.3f} | {max(r['peak_rss_mib']):,.0f} |")


def print_ratios(measured: List[dict]) -> None:
    """Graph-parallel / GNNPipe (and / hybrid) ratios of bytes and epoch time measured in the same invocation,
    and pipeline efficiency ``T(1) / (S T(S))`` against the bubble bound."""
    def find(name, mode, p, L, k=None):
        rows = [r for r in measured if (r["dataset"], r["mode"], r["procs"], r["layers"]) == (name, mode, p, L)
                and (k is None or r["chunks"] == k)]
        return rows[0] if rows else None

    keys = sorted({(r["dataset"], r["procs"], r["layers"]) for r in measured if r["mode"] != "single"})
    print("\n### Ratios, measured (graph parallel / other; K = 4S for GNNPipe, 4SG for hybrid)\n")
    print("| dataset | procs | L | bytes GP/GNNPipe | time GP/GNNPipe | bytes GP/hybrid | time GP/hybrid |")
    print("|---|---|---|---|---|---|---|")
    for name, p, L in keys:
        gp = find(name, "graph_parallel", p, L)
        cells = []
        for mode in ("gnnpipe", "hybrid"):
            other = find(name, mode, p, L, 4 * p)
            if gp and other:
                cells += [f"{sum(gp['sent'].values()) / sum(other['sent'].values()):.2f}",
                          f"{gp['epoch_s'] / other['epoch_s']:.2f}"]
            else:
                cells += ["-", "-"]
        print(f"| {name} | {p} | {L} | " + " | ".join(cells) + " |")
    print("\n### Pipeline efficiency T(1) / (S T(S)) of GNNPipe against the bubble bound\n")
    print("| dataset | S | K | L | T(1) s | T(S) s | efficiency | bound 1-(S-1)/(K+S-1) | bubble measured | bubble bound |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in measured:
        one = find(r["dataset"], "single", 1, r["layers"])
        if r["mode"] != "gnnpipe" or one is None:
            continue
        s, k = r["procs"], r["chunks"]
        bound = (s - 1) / (k + s - 1)
        bub = statistics.mean(b / t for b, t in zip(r["bubble_s"], r["step_s"]))
        print(f"| {r['dataset']} | {s} | {k} | {r['layers']} | {one['epoch_s']:.3f} | {r['epoch_s']:.3f} | "
              f"{one['epoch_s'] / (s * r['epoch_s']):.2f} | {1 - bound:.3f} | {bub:.3f} | {bound:.3f} |")


def plot(results: dict, png: str) -> None:
    """Bytes per epoch (formulas) and measured epoch time against depth, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for (name, p) in sorted({(r["dataset"], r["procs"]) for r in results["analytic"]}):
        rows = sorted((r for r in results["analytic"] if r["dataset"] == name and r["procs"] == p),
                      key=lambda r: r["layers"])
        ls = [r["layers"] for r in rows]
        line, = ax1.plot(ls, [r["gp_bytes"] / 2**20 for r in rows], "-o", label=f"{name} P={p} graph-par.")
        ax1.plot(ls, [r["pipe_bytes"] / 2**20 for r in rows], "--s", color=line.get_color(),
                 label=f"{name} P={p} GNNPipe")
    ax1.set(xscale="log", yscale="log", xlabel="layers L", ylabel="MiB per epoch (all ranks)",
            title="Communication volume")
    ax1.set_xticks([4, 8, 16, 32], ["4", "8", "16", "32"], minor=False)
    ax1.set_xticks([], minor=True)
    ax1.legend(fontsize=6, ncol=2)
    keys = sorted({(r["dataset"], r["mode"], r["procs"], r["chunks"]) for r in results["measured"]})
    for name, mode, p, k in keys:
        rows = sorted((r for r in results["measured"] if (r["dataset"], r["mode"], r["procs"], r["chunks"])
                       == (name, mode, p, k)), key=lambda r: r["layers"])
        ax2.plot([r["layers"] for r in rows], [r["epoch_s"] for r in rows], "-o",
                 label=f"{name} {mode} P={p} K={k}")
    ax2.set(xscale="log", xlabel="layers L", ylabel="seconds per epoch (median)", title="Epoch time (2 shared cores)")
    ax2.set_xticks([4, 8, 16, 32], ["4", "8", "16", "32"], minor=False)
    ax2.set_xticks([], minor=True)
    ax2.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def print_plans(args) -> None:
    """The planner's table per dataset, depth and process count, from measured per-layer times and bandwidth.

    Bandwidth: ``--bandwidth`` if given, else the median of the point-to-point bandwidths measured at the start of
    the multi-process runs stored in ``--json``.
    """
    if args.bandwidth is None:
        found = [r["bandwidth_Bps"] for r in json.loads(Path(args.json).read_text())["measured"]
                 if r.get("bandwidth_Bps")] if args.json and Path(args.json).exists() else []
        if not found:
            raise SystemExit("parallelism.py --plan: no measured bandwidth; pass --json with measured runs or "
                             "--bandwidth BYTES_PER_S.")
        args.bandwidth = statistics.median(found)
    from torch_geometric.nn.models import GCN

    from lightning_gnnpipe import find_layer_stack
    from lightning_gnnpipe.planner.cost import estimate_layouts, format_table, measure_layer_seconds

    for name in args.datasets:
        data = load(name, args.sbm_nodes)
        for L in args.layers:
            gnn = GCN(data.num_features, args.hidden, L, int(data.y.max()) + 1)
            blocks = find_layer_stack(gnn).blocks
            seconds = measure_layer_seconds(blocks, data.x, data.edge_index)
            dims = [data.num_features] + [args.hidden] * (L - 1) + [int(data.y.max()) + 1]
            params = sum(p.numel() for p in gnn.parameters())
            for p in args.procs:
                est = estimate_layouts(data.edge_index, data.num_nodes, dims, seconds, p, args.bandwidth,
                                       chunks_per_stage=args.chunks_per_stage, num_params=params,
                                       num_param_tensors=len(list(gnn.parameters())))
                print(f"\n{name}, L={L}, {p} processes, bandwidth {args.bandwidth:.2e} B/s, "
                      f"measured layer time {sum(seconds):.3f} s/epoch on 1 process")
                print(format_table(est))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["cora"])
    parser.add_argument("--modes", nargs="+", default=["single", "graph_parallel", "gnnpipe", "hybrid"])
    parser.add_argument("--layers", nargs="+", type=int, default=[4, 8, 16, 32])
    parser.add_argument("--procs", nargs="+", type=int, default=[2])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=6, help="1 warm-up + the timed ones")
    parser.add_argument("--chunks-per-stage", nargs="+", type=int, default=[4])
    parser.add_argument("--sbm-nodes", type=int, default=200_000)
    parser.add_argument("--analytic-only", action="store_true")
    parser.add_argument("--json", default=None, help="append the results to this JSON file")
    parser.add_argument("--plot", default=None, help="only draw a PNG from --json, then exit")
    parser.add_argument("--plan", action="store_true", help="print the planner's estimates and exit")
    parser.add_argument("--bandwidth", type=float, default=None,
                        help="planner: bytes/s between two ranks (default: measured, from --json)")
    args = parser.parse_args()
    if args.plan:
        print_plans(args)
        return
    if args.plot:
        results = json.loads(Path(args.json).read_text())
        print_tables(results["analytic"], results["measured"])
        print_ratios(results["measured"])
        plot(results, args.plot)
        return

    analytic, measured = [], []
    for name in args.datasets:
        data = load(name, args.sbm_nodes)
        if args.analytic_only:
            analytic += analytic_rows(data, name, args.procs, args.layers, args.hidden, args.chunks_per_stage[0])
            continue
        for L in args.layers:
            for mode in args.modes:
                for p in ([1] if mode == "single" else args.procs):
                    if mode == "hybrid" and p < 2 * HYBRID_PARTS:
                        continue  # needs S >= 2 and G = 2
                    for cps in (args.chunks_per_stage if mode in ("gnnpipe", "hybrid") else [1]):
                        res = run(data, mode, p, L, args.hidden, args.epochs, cps)
                        res["dataset"] = name
                        measured.append(res)
                        print(json.dumps(res), flush=True)
    print_tables(analytic, measured)
    if measured:
        print_ratios(measured)
    if args.json:
        path = Path(args.json)
        old = json.loads(path.read_text()) if path.exists() else {"analytic": [], "measured": []}
        old["analytic"] += analytic
        old["measured"] += measured
        path.write_text(json.dumps(old, indent=1))


if __name__ == "__main__":
    main()
