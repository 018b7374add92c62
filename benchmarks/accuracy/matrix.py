"""What the accuracy benchmark runs: its datasets, models and modes, and the published matrix of runs.

The matrix (:data:`TABLE`, :data:`STUDY`, :data:`SEED_STUDY` and the others) is that of
``docs/results/notes/accuracy.md``; :func:`plan_jobs` expands it, or a command line's selection, into the groups of
runs the report needs. Used by ``run.py`` (the runner) and ``report.py``.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn
from torch_geometric.nn.models import GAT, GraphSAGE

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

from lightning_gnnpipe import datasets as ds  # noqa: E402
from lightning_gnnpipe.nn.gcnii import GCNII  # noqa: E402
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
CACHE = os.path.join(ROOT, "benchmarks", "accuracy", "runs.jsonl")  # the records docs/results/accuracy.md reads


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
