"""Accuracy of GNNPipe's chunked training against exact full-graph training.

    python -m benchmarks.accuracy.run --out docs/results/notes  # docs/results/notes/accuracy.md and the PNG, from the cache
    python -m benchmarks.accuracy.run --datasets Cora --models resgcn8 --seeds 0 --epochs 50   # a quick look

Result cache: every finished run (dataset, model, mode, seed, epochs, lr, weight decay) is appended as one JSON line to
``benchmarks/accuracy/runs.jsonl`` with its validation curve and seconds; a later invocation reuses the
cached runs and computes only the missing ones (``--no-cache`` recomputes every run and appends the new lines,
which then win over the old ones).

Runner: the chunked algorithm runs in one process through the package's own stage module (``GNNStage`` holding
all layers), chunk after chunk in pipeline order. The multi-process pipeline computes exactly the same numbers
(``tests/test_exactness.py``: GPipe and 1F1B on 2 and 4 stages equal a sequential implementation within 1e-6), so
the number of stages does not change accuracy; running in one process keeps the benchmark within a 2-core budget.
Evaluation is the exact full-graph forward (equal to the pipelined exact evaluation, ``tests/test_stage.py``).
Reported: test metric at the epoch of best validation metric, mean +- std over seeds; epochs to reach 99% of the
best validation metric, mean and median over seeds (the ratio to exact is that of the means).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, Iterable, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.functional import accuracy, auroc

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, ROOT)

from benchmarks.accuracy.matrix import (AUC, CACHE, DATASET_EPOCHS, DATASETS, EPOCHS, MODELS, MODES,  # noqa: E402
                                        TABLE, TRAIN_REFRESH, plan_jobs)
from benchmarks.accuracy.report import reach_exact_target, replace_block, summarise, write_report  # noqa: E402
from lightning_gnnpipe import GraphChunkDataModule, find_layer_stack  # noqa: E402
from lightning_gnnpipe.nn.stack import infer_dims, takes_x0  # noqa: E402
from lightning_gnnpipe.data.chunk_graph import build_chunk_graph
from lightning_gnnpipe.nn.gcn_norm import norm_keys  # noqa: E402
from lightning_gnnpipe.pipeline.stage import GNNStage  # noqa: E402

__all__ = ["main", "chunked_stage", "chunked_forward",
           # moved to matrix.py and report.py; imported from here by the diagnostics beside this module
           "DATASETS", "MODELS", "TABLE", "replace_block"]


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def metric(name: str, out: torch.Tensor, y: torch.Tensor, num_classes: int) -> float:
    if name in AUC:
        return float(auroc(out.softmax(-1)[:, 1], y, task="binary"))
    return float(accuracy(out.argmax(-1), y, task="multiclass", num_classes=num_classes))


def chunked_stage(data, model: nn.Module, num_chunks: int, chunk_order: str, **options):
    """Return ``(plan, stage)``: the chunk plan and one ``GNNStage`` holding all of ``model``'s layers."""
    plan = GraphChunkDataModule(data, num_chunks=num_chunks, chunk_order=chunk_order).plan
    blocks = find_layer_stack(model).blocks
    dims = infer_dims(blocks, data.x[:2])
    graph = build_chunk_graph(plan, data.edge_index, norm_keys(blocks), torch.device("cpu"))
    stage = GNNStage(blocks, list(range(len(blocks))), dims, graph, x=data.x,
                     carry_x0=any(takes_x0(b) for b in blocks), **options)
    return plan, stage


def chunked_forward(plan, stage, x: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Run every chunk through ``stage`` in pipeline order; return the outputs of all nodes ``(|V|, C)``."""
    x_pad, m = plan.pad(x), plan.max_chunk_size
    outs = [stage(x_pad[c * m: (c + 1) * m], chunk_id=torch.tensor([c]))[: plan.nodes[c].numel()]
            for c in range(plan.num_chunks)]
    return torch.zeros(x.size(0), num_classes).index_put((torch.cat(list(plan.nodes)),), torch.cat(outs))


def run(dataset: str, data, model_name: str, mode: str, seed: int, epochs: int, lr: float,
        weight_decay: float = 5e-4) -> Dict[str, object]:
    torch.manual_seed(seed)
    num_classes = int(data.y.max()) + 1
    model = MODELS[model_name](data.num_features, num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    train = data.train_mask & (data.y >= 0)
    spec = MODES[mode]
    if spec is not None:
        num_chunks, chunk_order, options, refresh, refresh_every = spec
        plan, stage = chunked_stage(data, model, num_chunks, chunk_order, **options)
    val_curve, test_curve, start = [], [], time.perf_counter()
    for epoch in range(epochs):
        if spec is not None and (refresh and epoch == 0 or refresh_every and epoch and epoch % refresh_every == 0):
            if mode in TRAIN_REFRESH:
                model.train()
                stage.epoch = epoch  # this epoch's NodeDropout masks
            else:
                model.eval()
            stage.forward_full(data.x, write_history=True)
        model.train()
        opt.zero_grad()
        if spec is None:
            out = model(data.x, data.edge_index)
        else:
            stage.next_epoch(epoch)
            out = chunked_forward(plan, stage, data.x, num_classes)
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


Key = Tuple[str, str, str, int, int, float, float]  # dataset, model, mode, seed, epochs, lr, weight decay
WEIGHT_DECAY = 5e-4  # Adam's (L2) weight decay; cache lines without the field were run with it


def run_key(record: Dict[str, object]) -> Key:
    """Return the cache key of a run record."""
    return (record["dataset"], record["model"], record["mode"], int(record["seed"]), int(record["epochs"]),
            float(record["lr"]), float(record.get("weight_decay", WEIGHT_DECAY)))


def load_cache(path: str) -> Dict[Key, Dict[str, object]]:
    """Read the cached runs of ``path`` (one JSON object a line); a later line wins over an earlier one."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return {run_key(r): r for r in records}


def append_cache(path: str, record: Dict[str, object]) -> None:
    """Append one finished run to the cache file ``path``."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def git_commit() -> str:
    """Return the short commit of the checkout, or ``"unknown"`` outside git."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def parse_epochs(items: Iterable[str]) -> Dict[str, int]:
    """Parse ``Name=EPOCHS`` items of ``--dataset-epochs``.

    Raises:
        ValueError: An item is not ``Name=EPOCHS`` with a known dataset and a positive integer.
    """
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in DATASETS or not value.isdigit() or int(value) < 1:
            raise ValueError(f"accuracy.py: `--dataset-epochs` item {item!r} is not Name=EPOCHS with a dataset of "
                             f"{list(DATASETS)} and a positive integer. Example: Tolokers=30.")
        out[name] = int(value)
    return out


def collect(args) -> Dict[Key, Dict[str, object]]:
    """Return every run the report needs, from the cache where present, computing and caching the others."""
    cache = {} if args.no_cache else load_cache(args.cache)
    runs, data, commit = {}, {}, git_commit()
    for _, dataset, model_name, modes, seeds, job_epochs in plan_jobs(args):
        epochs = job_epochs or args.epochs_of(dataset)
        for mode in modes:
            for seed in seeds:
                key = (dataset, model_name, mode, seed, epochs, args.lr, args.weight_decay)
                if key in runs:
                    continue
                if key not in cache:
                    wd = {} if args.weight_decay == WEIGHT_DECAY else {"weight_decay": args.weight_decay}
                    if dataset not in data:
                        data[dataset] = DATASETS[dataset]()
                    r = run(dataset, data[dataset], model_name, mode, seed, epochs, args.lr, args.weight_decay)
                    cache[key] = {"dataset": dataset, "model": model_name, "mode": mode, "seed": seed,
                                  "epochs": epochs, "lr": args.lr, **wd, "test": r["test"], "reach": r["reach"],
                                  "seconds": round(r["seconds"], 2), "threads": args.threads, "commit": commit,
                                  "val": [round(v, 5) for v in r["val"]]}
                    append_cache(args.cache, cache[key])
                    print(f"{dataset:9s} {model_name:9s} {mode:18s} seed {seed}  test {100 * r['test']:6.2f}  "
                          f"reach {r['reach']:3d}  {r['seconds']:6.1f} s", flush=True)
                runs[key] = cache[key]
    return runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", choices=list(DATASETS), help="default: the published matrix")
    p.add_argument("--models", nargs="+", choices=list(MODELS), help="default: the published matrix")
    p.add_argument("--modes", nargs="+", choices=list(MODES), help="default: the published matrix")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=EPOCHS, help="epochs per run for datasets not in --dataset-epochs")
    p.add_argument("--dataset-epochs", nargs="*", default=[f"{k}={v}" for k, v in DATASET_EPOCHS.items()],
                   metavar="NAME=EPOCHS", help="per-dataset epochs (default: %(default)s)")
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--weight-decay", type=float, default=WEIGHT_DECAY,
                   help="Adam's (L2) weight decay (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--cache", default=CACHE, help="JSON-lines file of finished runs (default: %(default)s)")
    p.add_argument("--no-cache", action="store_true", help="recompute every run (the new lines win in the cache)")
    p.add_argument("--out", default=None, help="refresh <out>/accuracy.md and write the PNG (e.g. docs/results/notes)")
    args = p.parse_args()
    per_dataset = parse_epochs(args.dataset_epochs)
    args.epochs_of = lambda dataset: per_dataset.get(dataset, args.epochs)
    torch.set_num_threads(args.threads)
    runs = collect(args)
    for _, d, m, modes, seeds, epochs in plan_jobs(args):
        for mode in modes:
            r = summarise(args, runs, d, m, mode, seeds, epochs)
            common = ""
            if mode != "exact" and "exact" in modes:  # exact's own median is that of its `reach` (same target)
                median, never = reach_exact_target(args, runs, d, m, mode, seeds, epochs)
                exact_median = statistics.median(
                    runs[(d, m, "exact", s, epochs or args.epochs_of(d), args.lr, args.weight_decay)]["reach"]
                    for s in seeds)
                common = (f"  median epochs to 99% of exact's best val {'never' if median is None else median}"
                          f" (exact {exact_median}, never reached in {never} of {len(seeds)} seeds)")
            print(f"{d:9s} {m:9s} {mode:18s} test {r['mean']:6.2f} +- {r['std']:5.2f}  epochs to 99% best val "
                  f"{r['reach']:6.1f} (median {r['reach_median']:g})  {r['seconds']:6.1f} s/run{common}")
    if args.out:
        write_report(args, runs)


if __name__ == "__main__":
    main()
