"""One run of the time-to-accuracy benchmark, in its own process: ``python -m benchmarks.time_to_accuracy.worker SPEC DIR``.

``SPEC`` is a JSON object: ``graph`` (the fields of :class:`~benchmarks.time_to_accuracy.graph.GraphSpec`), ``model``
(:data:`~benchmarks.time_to_accuracy.models.MODELS`), ``mode``, ``epochs``, ``seed`` (of the weights), ``validate``
(validation every epoch, default true), ``chunks`` (K of the GNNPipe modes, default 8), ``lr`` (Adam's learning rate,
default the model's :data:`~benchmarks.time_to_accuracy.models.LEARNING_RATE`), ``lr_schedule`` (``"cosine"``:
cosine annealing to 0 over ``epochs``, stepped once per epoch; default constant) and ``strategy`` (more keyword
arguments of the strategy). Modes:

* ``exact``: one process, 2 threads (``threads``), a plain PyTorch loop on a CSR adjacency (the best single-process
  baseline; GCNII's normalisation baked into the values; :func:`~benchmarks.time_to_accuracy.bench.measure` starts
  it with torch's huge pages, ``THP_MEM_ALLOC_ENABLE=1``, as the strategies start their ranks); ``mlp`` the same loop
  without the graph;
* ``gnnpipe``: ``Trainer(devices=2, strategy=GNNPipeStrategy(**strategy))``, ``GraphChunkDataModule(num_chunks=K)``;
* ``graph_parallel``: ``Trainer(devices=2, strategy=GraphParallelStrategy())``, ``num_chunks=2``;
* ``hybrid``: ``Trainer(devices=4, strategy=GNNPipeStrategy(graph_parallel_size=2))``, ``num_chunks=K, num_parts=2``.

Writes ``DIR/result.json``: per epoch the training seconds (the step and Lightning's loop, without validation),
validation seconds, validation and test accuracy of the exact full-graph forward, training loss and bytes sent
(all ranks, the training step), CPU seconds in user and kernel mode and minor page faults over the epoch with its
validation (``user_s``, ``sys_s``, ``minflt``: rank 0's, and every rank's in ``ranks_cpu``); setup seconds; and
from every process ``DIR/mem_<role>.json`` (peak USS / PSS / RSS and ``VmHWM``, :mod:`benchmarks.harness.memory`).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, Trainer
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.utils import to_torch_csr_tensor

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.harness.memory import MemorySampler  # noqa: E402
from benchmarks.time_to_accuracy.graph import GraphSpec, community_graph  # noqa: E402
from benchmarks.time_to_accuracy.models import LEARNING_RATE, Classifier, accuracies, build_model, lr_scheduler  # noqa: E402
from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, GraphParallelStrategy  # noqa: E402

LONG = timedelta(hours=2)  # collectives may wait long on an emulated slow link


def cpu_since(before) -> Dict[str, float]:
    """This process's CPU seconds in user and kernel mode and its minor page faults since ``before`` (a
    ``resource.getrusage`` result): ``user_s``, ``sys_s``, ``minflt``."""
    now = resource.getrusage(resource.RUSAGE_SELF)
    return {"user_s": now.ru_utime - before.ru_utime, "sys_s": now.ru_stime - before.ru_stime,
            "minflt": float(now.ru_minflt - before.ru_minflt)}


class Epochs(Callback):
    """Per epoch on every rank: training and validation seconds; on rank 0 the logged metrics. Starts the rank's
    memory sampler; writes ``DIR/epochs_rank<r>.json`` at the end of the fit."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.rows, self.sampler = run_dir, [], None
        self._t = self._v = 0.0

    def setup(self, trainer, pl_module, stage):
        if trainer.world_size > 1:
            self.sampler = MemorySampler(self.run_dir / f"mem_rank{trainer.global_rank}.json").start()

    def on_train_epoch_start(self, trainer, pl_module):
        self._t, self._v = time.perf_counter(), 0.0
        self._ru = resource.getrusage(resource.RUSAGE_SELF)

    def on_validation_epoch_start(self, trainer, pl_module):
        self._v0 = time.perf_counter()

    def on_validation_epoch_end(self, trainer, pl_module):
        self._v += time.perf_counter() - self._v0

    def on_train_epoch_end(self, trainer, pl_module):
        total = time.perf_counter() - self._t
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                   if k in ("val_acc", "test_acc", "train_loss") or k.startswith("comm/")}
        self.rows.append({"train_s": total - self._v, "val_s": self._v, **metrics, **cpu_since(self._ru)})

    def on_train_end(self, trainer, pl_module):
        choice = getattr(trainer.strategy, "schedule_choice", None)  # what GNNPipeStrategy ran
        if trainer.global_rank == 0 and choice is not None:
            (self.run_dir / "schedule.json").write_text(json.dumps(list(choice)))

    def on_fit_end(self, trainer, pl_module):
        (self.run_dir / f"epochs_rank{trainer.global_rank}.json").write_text(json.dumps(self.rows))

    def teardown(self, trainer, pl_module, stage):
        if self.sampler is not None:
            self.sampler.stop()


def sent_bytes(row: dict) -> Optional[float]:
    """Bytes the ranks sent in one training step (``comm/sent_total``, else the sum of ``comm/sent/<kind>``)."""
    if "comm/sent_total" in row:
        return row["comm/sent_total"]
    kinds = [v for k, v in row.items() if k.startswith("comm/sent/")]
    return sum(kinds) if kinds else None


def exact_adjacency(model: torch.nn.Module, name: str, data):
    """The whole graph's CSR adjacency ``(|V|, |V|)`` the single process aggregates with; for GCNII-16 with the
    full-graph ``gcn_norm`` baked into its values once (and the model's convs told not to normalise again)."""
    n = data.num_nodes
    if name != "gcnii16":
        return to_torch_csr_tensor(data.edge_index.flip(0), size=(n, n))
    for conv in (m for m in model.modules() if hasattr(m, "normalize")):
        conv.normalize = False
    ei, weight = gcn_norm(data.edge_index, None, n, add_self_loops=True)
    return to_torch_csr_tensor(ei.flip(0), weight, size=(n, n))


def run_plain(spec: dict, data) -> List[dict]:
    """``exact`` / ``mlp``: one process (``threads`` intra-op threads, default 2), one full-graph Adam step and one
    exact evaluation per epoch."""
    torch.set_num_threads(spec.get("threads", 2))
    name = "mlp" if spec["mode"] == "mlp" else spec["model"]
    model = build_model(name, data.num_features, int(data.y.max()) + 1, spec["seed"])
    graph = None if spec["mode"] == "mlp" else exact_adjacency(model, spec["model"], data)
    run = (lambda: model(data.x)) if graph is None else (lambda: model(data.x, graph))
    opt = torch.optim.Adam(model.parameters(), lr=spec.get("lr", LEARNING_RATE[name]))
    sched = lr_scheduler(opt, spec.get("lr_schedule"), spec["epochs"])
    rows = []
    for _ in range(spec["epochs"]):
        t0, ru0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        model.train()
        opt.zero_grad()
        loss = F.cross_entropy(run()[data.train_mask], data.y[data.train_mask])
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        t1 = time.perf_counter()
        row = {"train_s": t1 - t0, "val_s": 0.0, "train_loss": float(loss)}
        if spec.get("validate", True):
            model.eval()
            with torch.no_grad():
                val, test = accuracies(run(), data)
            row.update(val_s=time.perf_counter() - t1, val_acc=float(val), test_acc=float(test))
        row.update(cpu_since(ru0))
        rows.append(row)
    return rows


def run_trainer(spec: dict, data, run_dir: Path) -> List[dict]:
    """A 2- or 4-process fit under one of the strategies."""
    mode, k = spec["mode"], spec.get("chunks", 8)
    options = {"timeout": LONG, "exchange_timeout": LONG, **spec.get("strategy", {})}
    if mode == "gnnpipe":
        devices, dm, strategy = 2, GraphChunkDataModule(data, num_chunks=k), GNNPipeStrategy(**options)
    elif mode == "graph_parallel":
        devices, dm, strategy = 2, GraphChunkDataModule(data, num_chunks=2), GraphParallelStrategy(**options)
    elif mode == "hybrid":
        devices, dm = 4, GraphChunkDataModule(data, num_chunks=k, num_parts=2)
        strategy = GNNPipeStrategy(graph_parallel_size=2, **options)
    else:
        raise ValueError(f"time_to_accuracy: unknown mode {mode!r}.")
    module = Classifier(build_model(spec["model"], data.num_features, int(data.y.max()) + 1, spec["seed"]),
                        spec.get("lr", LEARNING_RATE[spec["model"]]), spec.get("lr_schedule"), spec["epochs"])
    trainer = Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_epochs=spec["epochs"], logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, limit_val_batches=1 if spec.get("validate", True) else 0,
                      callbacks=[Epochs(run_dir)])
    trainer.fit(module, datamodule=dm)
    ranks = [json.loads((run_dir / f"epochs_rank{r}.json").read_text()) for r in range(devices)]
    rows = ranks[0]
    for e, row in enumerate(rows):  # an epoch lasts as long as its slowest rank's
        row["train_s"] = max(r[e]["train_s"] for r in ranks)
        row["val_s"] = max(r[e]["val_s"] for r in ranks)
        row["sent_bytes"] = sent_bytes(row)
        row["ranks_cpu"] = [{k: r[e][k] for k in ("user_s", "sys_s", "minflt")} for r in ranks]
    return rows


def start_run(spec: dict, run_dir: Path) -> Tuple[MemorySampler, Any, float, float]:
    """Begin a worker's run: ``run_dir`` made, this process's memory sampler started, the graph of ``spec["graph"]``
    built; returns ``(sampler, graph, start time (perf_counter), seconds the graph took)``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    sampler = MemorySampler(run_dir / "mem_main.json").start()
    t0 = time.perf_counter()
    data = community_graph(GraphSpec(**spec["graph"]))
    return sampler, data, t0, time.perf_counter() - t0


def main(spec: dict, run_dir: Path) -> None:
    sampler, data, t0, graph_s = start_run(spec, run_dir)
    try:
        rows = run_plain(spec, data) if spec["mode"] in ("exact", "mlp") else run_trainer(spec, data, run_dir)
    finally:
        sampler.stop()
    result: Dict[str, object] = {"epochs": rows, "graph_s": graph_s, "wall_s": time.perf_counter() - t0,
                                 "num_edges": int(data.edge_index.size(1))}
    if (run_dir / "schedule.json").exists():
        result["schedule"] = json.loads((run_dir / "schedule.json").read_text())
    (run_dir / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), Path(sys.argv[2]))
