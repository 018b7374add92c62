"""Accuracy of GNNPipe's chunked training against exact full-graph training.

    python benchmarks/accuracy.py                                  # the table in docs/results/accuracy.md
    python benchmarks/accuracy.py --datasets Cora --models resgcn8 --seeds 0 --epochs 50   # a quick look

Runner: the chunked algorithm runs in one process through the package's own stage module (``GNNStage`` holding
all layers), chunk after chunk in pipeline order. The multi-process pipeline computes exactly the same numbers
(``tests/test_exactness.py``: GPipe and 1F1B on 2 and 4 stages equal a sequential implementation within 1e-6), so
the number of stages does not change accuracy; running in one process keeps the benchmark within a 2-core budget.
Evaluation is the exact full-graph forward (equal to the pipelined exact evaluation, ``tests/test_stage.py``).
Reported: test metric at the epoch of best validation metric, mean +- std over seeds; epochs to reach 99% of the
best validation metric.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn.models import GAT, GraphSAGE
from torchmetrics.functional import accuracy, auroc

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

from lightning_gnnpipe import GraphChunkDataModule, find_layer_stack  # noqa: E402
from lightning_gnnpipe import datasets as ds  # noqa: E402
from lightning_gnnpipe.nn.gcnii import GCNII  # noqa: E402
from lightning_gnnpipe.nn.stack import infer_dims, takes_x0  # noqa: E402
from lightning_gnnpipe.pipeline.graph import build_chunk_graph  # noqa: E402
from lightning_gnnpipe.pipeline.stage import GNNStage  # noqa: E402
from train import DeepResGCN  # noqa: E402  (examples/train.py)

DATASETS: Dict[str, Callable] = {
    "Cora": lambda: ds.load_planetoid("Cora"),
    "CiteSeer": lambda: ds.load_planetoid("CiteSeer"),
    "Actor": lambda: ds.load_actor(0),
    "Tolokers": lambda: ds.load_tolokers(0),
    "Cornell5": lambda: ds.load_cornell5(0),
}
AUC = {"Tolokers"}  # ROC-AUC instead of accuracy

MODELS: Dict[str, Callable[[int, int], nn.Module]] = {
    "resgcn4": lambda f, c: DeepResGCN(f, 64, c, 4, 0.5),
    "resgcn8": lambda f, c: DeepResGCN(f, 64, c, 8, 0.5),
    "resgcn16": lambda f, c: DeepResGCN(f, 64, c, 16, 0.5),
    "sage8": lambda f, c: GraphSAGE(f, 64, 8, c, dropout=0.5),
    "gat4": lambda f, c: GAT(f, 16, 4, c, heads=4, dropout=0.5),
    "gcnii16": lambda f, c: GCNII(f, 64, c, 16, dropout=0.5),
    "gcnii32": lambda f, c: GCNII(f, 64, c, 32, dropout=0.5),
}

# mode -> (num_chunks, stage options, refresh_on_start, refresh_every); None = exact full-graph training
MODES: Dict[str, object] = {
    "exact": None,
    "pipe-K4-plain": (4, {}, False, 0),
    "pipe-K8-plain": (8, {}, False, 0),
    "pipe-K8-default": (8, {}, True, 0),
    # single techniques on top of the refresh at start, to choose the defaults
    "pipe-K8-refresh10": (8, {}, True, 10),
    "pipe-K8-momentum": (8, {"history_momentum": 0.5}, True, 0),
    "pipe-K8-halograd": (8, {"halo_gradients": "stale"}, True, 0),
}
TABLE_MODES = ["exact", "pipe-K4-plain", "pipe-K8-plain", "pipe-K8-default"]


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def metric(name: str, out: torch.Tensor, y: torch.Tensor, num_classes: int) -> float:
    if name in AUC:
        return float(auroc(out.softmax(-1)[:, 1], y, task="binary"))
    return float(accuracy(out.argmax(-1), y, task="multiclass", num_classes=num_classes))


def run(dataset: str, data, model_name: str, mode: str, seed: int, epochs: int, lr: float) -> Dict[str, object]:
    torch.manual_seed(seed)
    num_classes = int(data.y.max()) + 1
    model = MODELS[model_name](data.num_features, num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=5e-4)
    train = data.train_mask & (data.y >= 0)
    spec = MODES[mode]
    if spec is not None:
        num_chunks, options, refresh, refresh_every = spec
        plan = GraphChunkDataModule(data, num_chunks=num_chunks).plan
        blocks = find_layer_stack(model).blocks
        dims = infer_dims(blocks, data.x[:2])
        graph = build_chunk_graph(plan, data.edge_index, blocks, torch.device("cpu"))
        stage = GNNStage(blocks, list(range(len(blocks))), dims, graph, x=data.x,
                         carry_x0=any(takes_x0(b) for b in blocks), **options)
        x_pad, m = plan.pad(data.x), plan.max_chunk_size
        nodes = torch.cat(list(plan.nodes))
    val_curve, test_curve, start = [], [], time.perf_counter()
    for epoch in range(epochs):
        if spec is not None and (refresh and epoch == 0 or refresh_every and epoch and epoch % refresh_every == 0):
            model.eval()
            stage.forward_full(data.x, write_history=True)
        model.train()
        opt.zero_grad()
        if spec is None:
            out = model(data.x, data.edge_index)
        else:
            stage.next_epoch()
            outs = [stage(x_pad[c * m: (c + 1) * m], chunk_id=torch.tensor([c]))[: plan.nodes[c].numel()]
                    for c in range(plan.num_chunks)]
            out = torch.zeros(data.num_nodes, num_classes).index_put((nodes,), torch.cat(outs))
        F.cross_entropy(out[train], data.y[train]).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            out = model(data.x, data.edge_index)
        val_curve.append(metric(dataset, out[data.val_mask], data.y[data.val_mask], num_classes))
        test_curve.append(metric(dataset, out[data.test_mask], data.y[data.test_mask], num_classes))
    best = max(range(epochs), key=lambda e: val_curve[e])
    reach = next(e for e in range(epochs) if val_curve[e] >= 0.99 * val_curve[best]) + 1
    return {"test": test_curve[best], "val": val_curve, "reach": reach, "seconds": time.perf_counter() - start}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", default=["Cora", "CiteSeer", "Actor"], choices=list(DATASETS))
    p.add_argument("--models", nargs="+", default=["resgcn4", "resgcn8", "sage8", "gat4"], choices=list(MODELS))
    p.add_argument("--modes", nargs="+", default=TABLE_MODES, choices=list(MODES))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--out", default=None, help="write the markdown table and PNG here (e.g. docs/results)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    rows: List[Dict[str, object]] = []
    curves: Dict[str, Dict[str, List[float]]] = {}
    for dataset in args.datasets:
        data = DATASETS[dataset]()
        for model_name in args.models:
            for mode in args.modes:
                tests, reach, secs = [], [], 0.0
                for seed in args.seeds:
                    r = run(dataset, data, model_name, mode, seed, args.epochs, args.lr)
                    tests.append(100 * r["test"])
                    reach.append(r["reach"])
                    secs += r["seconds"]
                    if seed == args.seeds[0] and model_name == args.models[0]:
                        curves.setdefault(dataset, {})[mode] = r["val"]
                row = {"dataset": dataset, "model": model_name, "mode": mode,
                       "mean": statistics.mean(tests), "std": statistics.pstdev(tests),
                       "reach": statistics.mean(reach), "seconds": secs / len(args.seeds)}
                rows.append(row)
                print(f"{dataset:9s} {model_name:9s} {mode:16s} test {row['mean']:6.2f} +- {row['std']:5.2f}  "
                      f"epochs to 99% best val {row['reach']:6.1f}  {row['seconds']:6.1f} s/run", flush=True)
    if args.out:
        write_report(args, rows, curves)


def write_report(args, rows, curves) -> None:
    os.makedirs(args.out, exist_ok=True)
    exact = {(r["dataset"], r["model"]): r for r in rows if r["mode"] == "exact"}
    lines = ["| dataset | model | mode | test metric (%) | gap to exact (points) | epochs to 99% best val | ratio |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        ref = exact.get((r["dataset"], r["model"]))
        gap = f"{r['mean'] - ref['mean']:+.2f}" if ref and r is not ref else ""
        ratio = f"{r['reach'] / ref['reach']:.2f}" if ref and r is not ref else ""
        lines.append(f"| {r['dataset']} | {r['model']} | {r['mode']} | {r['mean']:.2f} ± {r['std']:.2f} | {gap} | "
                     f"{r['reach']:.1f} | {ratio} |")
    command = "python benchmarks/accuracy.py " + " ".join(sys.argv[1:])
    header = ["# Accuracy: GNNPipe against exact full-graph training", "", "Regenerate (table and PNG):", "",
              "```bash", command, "```", "",
              "Test metric at the epoch of best validation metric, mean ± std over seeds (accuracy; ROC-AUC for "
              "Tolokers). Epochs to reach 99% of the best validation metric; ratio = GNNPipe / exact.", ""]
    with open(os.path.join(args.out, "accuracy.md"), "w") as f:
        f.write("\n".join(header + lines) + "\n\n![validation curves](accuracy_curves.png)\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG written (pip install matplotlib)")
        return
    names = list(curves)[:2]
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        for mode, curve in curves[name].items():
            ax.plot(range(1, len(curve) + 1), curve, label=mode)
        ax.set_title(f"{name}, {args.models[0]}, seed {args.seeds[0]}")
        ax.set_xlabel("epoch")
        ax.set_ylabel("validation metric")
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "accuracy_curves.png"), dpi=100)


if __name__ == "__main__":
    main()
