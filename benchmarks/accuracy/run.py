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
import textwrap
import time
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn.models import GAT, GraphSAGE
from torchmetrics.functional import accuracy, auroc

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

from lightning_gnnpipe import GraphChunkDataModule, find_layer_stack  # noqa: E402
from lightning_gnnpipe import datasets as ds  # noqa: E402
from lightning_gnnpipe.nn.gcnii import GCNII  # noqa: E402
from lightning_gnnpipe.nn.stack import infer_dims, takes_x0  # noqa: E402
from lightning_gnnpipe.data.chunk_graph import build_chunk_graph
from lightning_gnnpipe.nn.gcn_norm import norm_keys  # noqa: E402
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
    "resgcn4-nodropout": lambda f, c: DeepResGCN(f, 64, c, 4, 0.0),  # diagnostic (seed-noise section)
    "resgcn4-nodedrop": lambda f, c: DeepResGCN(f, 64, c, 4, 0.5, node_dropout=True),  # NodeDropout
    "sage8": lambda f, c: GraphSAGE(f, 64, 8, c, dropout=0.5),
    "gat4": lambda f, c: GAT(f, 16, 4, c, heads=4, dropout=0.5),
    "gat4-nodropout": lambda f, c: GAT(f, 16, 4, c, heads=4, dropout=0.0),  # diagnostic (seed-noise section)
    "gcnii16": lambda f, c: GCNII(f, 64, c, 16, dropout=0.5),
    "gcnii32": lambda f, c: GCNII(f, 64, c, 32, dropout=0.5),
}

# mode -> (num_chunks, chunk_order, stage options, refresh_on_start, refresh_every); None = exact full-graph
# training. "plain" has no technique: METIS's chunk order, tables starting from zeros. "default" is the strategy's
# defaults (greedy chunk order, exact refresh at the start of fit); the single techniques are added to the default.
MODES: Dict[str, object] = {
    "exact": None,
    "pipe-K4-plain": (4, "metis", {}, False, 0),
    "pipe-K8-plain": (8, "metis", {}, False, 0),
    "pipe-K8-default": (8, "greedy", {}, True, 0),
    "pipe-K8-refresh10": (8, "greedy", {}, True, 10),
    "pipe-K8-momentum": (8, "greedy", {"history_momentum": 0.5}, True, 0),
    "pipe-K8-momentum90": (8, "greedy", {"history_momentum": 0.9}, True, 0),  # stronger smoothing (seed-noise section)
    "pipe-K8-halograd": (8, "greedy", {"halo_gradients": "stale"}, True, 0),
    "pipe-K8-refresh1": (8, "greedy", {}, True, 1),
    "pipe-K8-momentum-refresh10": (8, "greedy", {"history_momentum": 0.5}, True, 10),
    "pipe-K8-refresh1-halograd": (8, "greedy", {"halo_gradients": "stale"}, True, 1),
    "pipe-K8-refresh1-train": (8, "greedy", {}, True, 1),
    "pipe-K1-default": (1, "greedy", {}, True, 0),  # one chunk: no halo, no staleness (control, seed-noise section)
    "pipe-K2-default": (2, "greedy", {}, True, 0),  # the defaults with other chunk counts (seed-noise section)
    "pipe-K4-default": (4, "greedy", {}, True, 0),
    "pipe-K16-default": (16, "greedy", {}, True, 0),
    "pipe-K8-bf16h": (8, "greedy", {"history_dtype": torch.bfloat16}, True, 0),  # the defaults, bfloat16 tables
}
# Modes whose refresh runs in training mode at the epoch's NodeDropout masks: with a NodeDropout model the chunked
# forward then equals the full-graph forward exactly, and only the detached halo gradients differ.
TRAIN_REFRESH = {"pipe-K8-refresh1-train"}
TABLE_MODES = ["exact", "pipe-K4-plain", "pipe-K8-plain", "pipe-K8-default"]
STUDY_MODES = ["exact", "pipe-K8-default", "pipe-K8-refresh10", "pipe-K8-momentum", "pipe-K8-halograd"]

# The published matrix (docs/results/notes/accuracy.md): dataset -> models in the main table ...
TABLE: Dict[str, List[str]] = {
    "Cora": ["resgcn4", "resgcn8", "resgcn16", "sage8", "gat4", "gcnii16", "gcnii32"],
    "CiteSeer": ["resgcn4", "resgcn8", "resgcn16", "sage8", "gat4", "gcnii16", "gcnii32"],
    "Actor": ["resgcn4", "resgcn8", "resgcn16", "sage8", "gat4", "gcnii16", "gcnii32"],
    "Tolokers": ["resgcn4", "resgcn8", "resgcn16", "sage8", "gat4", "gcnii16", "gcnii32"],
    "Cornell5": ["gat4"],
}
# ... pairs of the table run in fewer modes than TABLE_MODES (the runs' cost) ...
TABLE_MODES_OF: Dict[Tuple[str, str], List[str]] = {("Tolokers", "resgcn16"): ["exact", "pipe-K8-default"],
                                                    ("Tolokers", "gcnii16"): ["exact", "pipe-K8-default"],
                                                    ("Tolokers", "gcnii32"): ["exact", "pipe-K8-default"]}
# ... dataset -> models of the "Choosing the defaults" study (STUDY_MODES) ...
STUDY: Dict[str, List[str]] = {"Cora": ["resgcn8", "gcnii16"], "CiteSeer": ["resgcn8", "gcnii16"]}
# ... (dataset, model) -> modes of the seed-noise study, run with SEED_STUDY_SEEDS instead of --seeds ...
SEED_STUDY: Dict[Tuple[str, str], List[str]] = {
    ("Cora", "gat4"): ["exact", "pipe-K4-plain", "pipe-K8-default", "pipe-K8-refresh1", "pipe-K8-momentum-refresh10"],
    ("Cora", "sage8"): ["exact", "pipe-K4-plain", "pipe-K8-default", "pipe-K8-momentum"],
    ("CiteSeer", "sage8"): ["exact", "pipe-K4-plain", "pipe-K8-default", "pipe-K8-momentum"],
    ("Actor", "resgcn4"): ["exact", "pipe-K8-default", "pipe-K8-halograd"],
    ("CiteSeer", "resgcn4"): ["exact", "pipe-K1-default", "pipe-K2-default", "pipe-K4-default", "pipe-K8-default",
                              "pipe-K16-default", "pipe-K8-halograd", "pipe-K8-refresh1", "pipe-K8-momentum"],
    ("CiteSeer", "gat4"): ["exact", "pipe-K1-default", "pipe-K2-default", "pipe-K4-default", "pipe-K8-default",
                           "pipe-K16-default", "pipe-K8-halograd", "pipe-K8-refresh1", "pipe-K8-refresh1-halograd",
                           "pipe-K8-momentum"],
    ("CiteSeer", "resgcn4-nodropout"): ["exact", "pipe-K8-default"],
    ("CiteSeer", "gat4-nodropout"): ["exact", "pipe-K8-default"],
    ("CiteSeer", "resgcn4-nodedrop"): ["exact", "pipe-K8-default", "pipe-K8-refresh1-train"],
    ("Tolokers", "resgcn8"): ["exact", "pipe-K8-default"],
    ("Actor", "gcnii32"): ["exact", "pipe-K8-default"],
}
SEED_STUDY_SEEDS = list(range(10))
# ... (dataset, model) -> modes run with 20 seeds (SEED_STUDY_20_SEEDS): the reference's own seed noise ...
SEED_STUDY_20: Dict[Tuple[str, str], List[str]] = {
    ("CiteSeer", "resgcn4"): ["exact", "pipe-K8-default", "pipe-K8-momentum", "pipe-K8-momentum90"],
    ("CiteSeer", "gat4"): ["exact", "pipe-K2-default", "pipe-K8-default", "pipe-K8-momentum", "pipe-K8-momentum90"],
    ("CiteSeer", "resgcn4-nodedrop"): ["exact", "pipe-K8-default", "pipe-K8-refresh1-train"],
}
SEED_STUDY_20_SEEDS = list(range(20))
# ... (dataset, model) -> (epochs, modes, seeds) of the longer runs (the large graphs, more epochs than the table) ...
LONGER: Dict[Tuple[str, str], Tuple[int, List[str], List[int]]] = {
    ("Tolokers", "resgcn8"): (100, ["exact", "pipe-K8-default"], [0, 1, 2]),
    ("Tolokers", "gcnii16"): (100, ["exact", "pipe-K8-default", "pipe-K8-halograd"], [0, 1, 2]),
    ("Tolokers", "resgcn16"): (100, ["exact", "pipe-K4-default", "pipe-K8-default", "pipe-K8-halograd",
                                     "pipe-K8-refresh1", "pipe-K8-momentum"], [0, 1, 2]),
    ("Tolokers", "gcnii32"): (100, ["exact", "pipe-K8-default", "pipe-K8-halograd"], [0, 1, 2]),
}
# ... (dataset, model) -> (epochs, modes, seeds) of techniques tried on a large-graph pair outside the criterion ...
LARGE_TECHNIQUES: Dict[Tuple[str, str], Tuple[int, List[str], List[int]]] = {
    ("Tolokers", "resgcn8"): (30, ["exact", "pipe-K8-default", "pipe-K8-halograd"], [0, 1, 2]),
    ("Tolokers", "gcnii16"): (30, ["exact", "pipe-K8-default", "pipe-K8-halograd"], [0, 1, 2]),
    ("Tolokers", "gcnii32"): (30, ["exact", "pipe-K8-default", "pipe-K8-halograd"], [0, 1, 2]),
}
# ... and the validation curves of the PNG (seed 0, TABLE_MODES).
PLOT: List[Tuple[str, str]] = [("Cora", "resgcn8"), ("CiteSeer", "resgcn8")]
EPOCHS = 100  # per run, the same in every mode of a (dataset, model) pair
DATASET_EPOCHS: Dict[str, int] = {"Tolokers": 30, "Cornell5": 20}  # the large graphs: fewer epochs
CACHE = os.path.join(ROOT, "benchmarks", "results", "accuracy_runs.jsonl")


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


Job = Tuple[str, str, str, List[str], List[int], Optional[int]]  # section, dataset, model, modes, seeds, epochs


def plan_jobs(args) -> List[Job]:
    """Return the (section, dataset, model, modes, seeds, epochs) groups to report.

    Section ``"table"`` is the main table, ``"study"`` the defaults study, ``"seeds"`` the seed-noise study
    (``"seeds20"`` its 20-seed part),
    ``"longer"`` the longer runs, ``"techniques"`` the techniques on a large graph. With any of ``--datasets``,
    ``--models``, ``--modes``: their product (missing ones from the published matrix) with ``--seeds``, all in
    ``"table"``; otherwise the published matrix (:data:`TABLE` in :data:`TABLE_MODES`, or in :data:`TABLE_MODES_OF`
    for the pairs listed there, :data:`STUDY`, :data:`SEED_STUDY`, :data:`SEED_STUDY_20`, :data:`LONGER` and
    :data:`LARGE_TECHNIQUES`).
    ``epochs`` is ``None`` for the dataset's epochs (``--epochs``,
    ``--dataset-epochs``).
    """
    if args.datasets or args.models or args.modes:
        datasets = args.datasets or list(TABLE)
        models = args.models or ["resgcn8"]
        return [("table", d, m, args.modes or TABLE_MODES, args.seeds, None) for d in datasets for m in models]
    jobs = [("table", d, m, TABLE_MODES_OF.get((d, m), TABLE_MODES), args.seeds, None) for d, models in TABLE.items()
            for m in models]
    jobs += [("study", d, m, STUDY_MODES, args.seeds, None) for d, models in STUDY.items() for m in models]
    jobs += [("seeds", d, m, modes, SEED_STUDY_SEEDS, None) for (d, m), modes in SEED_STUDY.items()]
    jobs += [("seeds20", d, m, modes, SEED_STUDY_20_SEEDS, None) for (d, m), modes in SEED_STUDY_20.items()]
    jobs += [("longer", d, m, modes, seeds, epochs) for (d, m), (epochs, modes, seeds) in LONGER.items()]
    jobs += [("techniques", d, m, modes, seeds, epochs) for (d, m), (epochs, modes, seeds) in LARGE_TECHNIQUES.items()]
    return jobs


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


def summarise(args, runs, dataset: str, model_name: str, mode: str, seeds: List[int],
              epochs: Optional[int] = None) -> Dict[str, object]:
    """Return mean/std test metric (%), mean and median epochs to 99% best val and mean seconds over ``seeds``."""
    epochs = epochs or args.epochs_of(dataset)
    rs = [runs[(dataset, model_name, mode, s, epochs, args.lr, args.weight_decay)] for s in seeds]
    tests = [100 * r["test"] for r in rs]
    return {"dataset": dataset, "model": model_name, "mode": mode, "epochs": epochs, "tests": tests,
            "mean": statistics.mean(tests), "std": statistics.pstdev(tests),
            "reach": statistics.mean(r["reach"] for r in rs),
            "reach_median": statistics.median(r["reach"] for r in rs),
            "seconds": statistics.mean(r["seconds"] for r in rs)}


def reach_exact_target(args, runs, dataset: str, model_name: str, mode: str, seeds: List[int],
                       epochs: Optional[int] = None) -> Tuple[Optional[float], int]:
    """Return the median epochs for ``mode`` to reach 99% of exact's best validation metric of the same seed.

    A common target for both modes: unlike ``epochs to 99% best val``, a run that ends with a higher best of its
    own is not penalised for it. Returns ``(median, never)``, ``never`` the number of seeds whose run does not reach
    the target in its epochs (counted as infinitely slow in the median; ``None`` when more than half never do).
    """
    epochs = epochs or args.epochs_of(dataset)
    found = []
    for s in seeds:
        target = 0.99 * max(runs[(dataset, model_name, "exact", s, epochs, args.lr, args.weight_decay)]["val"])
        val = runs[(dataset, model_name, mode, s, epochs, args.lr, args.weight_decay)]["val"]
        found.append(next((i + 1 for i, v in enumerate(val) if v >= target), float("inf")))
    median = statistics.median(found)
    return (None if median == float("inf") else median), sum(f == float("inf") for f in found)


def table(rows: List[Dict[str, object]]) -> List[str]:
    """Return markdown table lines with the gap (points) and epochs ratio of each row to its exact row.

    The standard error of the gap is that of the mean of the per-seed differences (same seed: same initial
    weights in both modes), ``stdev(diffs) / sqrt(seeds)``.
    """
    exact = {(r["dataset"], r["model"]): r for r in rows if r["mode"] == "exact"}
    lines = ["| dataset | model | epochs | mode | test metric (%) | gap to exact (points) | std error of gap "
             "| epochs to 99% best val | median epochs | ratio to exact | s/run |", "|---" * 11 + "|"]
    for r in rows:
        ref = exact.get((r["dataset"], r["model"]))
        other = ref is not None and r is not ref
        gap = f"{r['mean'] - ref['mean']:+.2f}" if other else ""
        diffs = [a - b for a, b in zip(r["tests"], ref["tests"])] if other else []
        se = f"{statistics.stdev(diffs) / len(diffs) ** 0.5:.2f}" if len(diffs) > 1 else ""
        ratio = f"{r['reach'] / ref['reach']:.2f}" if other else ""
        lines.append(f"| {r['dataset']} | {r['model']} | {r['epochs']} | {r['mode']} | {r['mean']:.2f} ± "
                     f"{r['std']:.2f} | {gap} | {se} | {r['reach']:.1f} | {r['reach_median']:g} | {ratio} | "
                     f"{r['seconds']:.0f} |")
    return lines


def study_averages(rows: List[Dict[str, object]]) -> List[str]:
    """Return markdown lines averaging, per technique mode, the gap and epochs ratio to exact over the pairs."""
    exact = {(r["dataset"], r["model"]): r for r in rows if r["mode"] == "exact"}
    lines = ["| mode | mean gap to exact (points) | worst gap (points) | mean epochs ratio | worst epochs ratio |",
             "|---|---|---|---|---|"]
    for mode in STUDY_MODES[1:]:
        sel = [r for r in rows if r["mode"] == mode]
        gaps = [r["mean"] - exact[(r["dataset"], r["model"])]["mean"] for r in sel]
        ratios = [r["reach"] / exact[(r["dataset"], r["model"])]["reach"] for r in sel]
        lines.append(f"| {mode} | {statistics.mean(gaps):+.2f} | {min(gaps):+.2f} | {statistics.mean(ratios):.2f} | "
                     f"{max(ratios):.2f} |")
    return lines


def command_block(args, runs) -> List[str]:
    """Return the markdown lines with the regenerating command and the cost of a run from scratch."""
    hours = sum(r["seconds"] for r in runs.values()) / 3600
    return ["```bash", "python -m benchmarks.accuracy.run " + " ".join(sys.argv[1:]), "```", ""] + textwrap.wrap(
            f"It reads the {len(runs)} runs it needs from `benchmarks/accuracy/runs.jsonl` (seconds). On a "
            f"fresh machine, or with `--no-cache`, it computes them: {hours:.1f} hours of one CPU core "
            "(`--threads 1`), the sum of the seconds measured for each run and stored in the cache (measured on a "
            "shared, loaded machine: an idle one needs less).", 116, break_on_hyphens=False)


def replace_block(text: str, name: str, lines: List[str]) -> str:
    """Replace the lines between ``<!-- begin NAME -->`` and ``<!-- end NAME -->`` (append the block if absent)."""
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    block = "\n".join([begin] + lines + [end])
    if begin in text and end in text:
        return text[: text.index(begin)] + block + text[text.index(end) + len(end):]
    return text.rstrip("\n") + "\n\n" + block + "\n"


def write_report(args, runs) -> None:
    """Refresh the generated blocks of ``<out>/accuracy.md`` (prose around them is kept) and write the PNG."""
    os.makedirs(args.out, exist_ok=True)
    rows = {"table": [], "study": [], "seeds": [], "seeds20": [], "longer": [], "techniques": []}
    for section, d, m, modes, seeds, epochs in plan_jobs(args):
        rows[section] += [summarise(args, runs, d, m, mode, seeds, epochs) for mode in modes]
    path = os.path.join(args.out, "accuracy.md")
    text = open(path).read() if os.path.exists(path) else "# Accuracy: GNNPipe against exact full-graph training\n"
    text = replace_block(text, "command", command_block(args, runs))
    text = replace_block(text, "table", table(rows["table"]))
    if rows["study"]:
        text = replace_block(text, "study", table(rows["study"]) + [""] + study_averages(rows["study"]))
    for name in ("seeds", "seeds20", "longer", "techniques"):
        if rows[name]:
            text = replace_block(text, name, table(rows[name]))
    with open(path, "w") as f:
        f.write(text)
    plot(args, runs)


def plot(args, runs) -> None:
    """Write ``<out>/accuracy_curves.png``: validation curves of seed 0 per table mode for the PLOT pairs."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG written (pip install matplotlib)")
        return
    key = lambda d, m, mode: (d, m, mode, args.seeds[0], args.epochs_of(d), args.lr, args.weight_decay)  # noqa: E731
    pairs = [(d, m) for d, m in PLOT if all(key(d, m, mode) in runs for mode in TABLE_MODES)]
    if not pairs:
        return
    fig, axes = plt.subplots(1, len(pairs), figsize=(6 * len(pairs), 4), squeeze=False)
    for ax, (dataset, model_name) in zip(axes[0], pairs):
        for mode in TABLE_MODES:
            curve = runs[key(dataset, model_name, mode)]["val"]
            ax.plot(range(1, len(curve) + 1), curve, label=mode)
        ax.set_title(f"{dataset}, {model_name}, seed {args.seeds[0]}")
        ax.set_xlabel("epoch")
        ax.set_ylabel("validation metric")
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "accuracy_curves.png"), dpi=100)


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
