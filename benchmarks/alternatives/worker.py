"""One run of the alternatives benchmark, in its own process: ``python -m benchmarks.alternatives.worker SPEC DIR``.

``SPEC`` is a JSON object: ``graph`` (the fields of :class:`~benchmarks.time_to_accuracy.graph.GraphSpec`), ``model``
(``ressage8`` or ``gcnii16``, :mod:`benchmarks.time_to_accuracy.models`), ``method``, ``seed``, ``max_epochs``,
``patience`` (early stopping: stop after this many epochs without a better validation accuracy, as Lightning's
``EarlyStopping(monitor="val_acc", mode="max", patience=...)``), ``budget_s`` (stop once training and validation
took this many seconds), ``epochs`` (a fixed number instead: timing runs), and for ``gnnpipe`` ``chunks`` (``K``),
``chunks_per_step`` (``None``: one step an epoch), ``chunk_groups`` and ``strategy`` (more strategy options). Methods:

* ``exact``: one process, 2 threads, a plain PyTorch loop on a CSR adjacency (one Adam step an epoch);
* ``gnnpipe``: ``Trainer(devices=2, strategy=GNNPipeStrategy(...))`` with ``EarlyStopping``;
* ``cluster_gcn``: one process, 2 threads, Cluster-GCN's batches (:class:`~benchmarks.alternatives.baselines.ClusterBatches`;
  ``cluster_parts`` clusters, ``cluster_batch`` a batch, default PyG's example's 1,500 and 20);
* ``neighbor_ddp``: 2 processes (gloo, one thread each), ``NeighborLoader`` + ``DistributedDataParallel``.

Every method validates with the exact full-graph forward after every epoch (the mini-batch methods in one process on
2 threads, as the exact method does; under DDP on rank 0 while rank 1 waits). Writes ``DIR/result.json``: per epoch
``train_s`` (training, seconds), ``val_s`` (validation, seconds), ``val_acc``, ``test_acc``, ``train_loss``, ``steps``
(optimizer steps); ``setup_s`` (graph built to first epoch, METIS included), ``stopped`` (why the run ended);
``DIR/mem_<role>.json`` from every process (:mod:`benchmarks.harness.memory`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import EarlyStopping

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.alternatives.baselines import (CLUSTER_BATCH, CLUSTER_PARTS, NEIGHBOR_BATCH, ClusterBatches,  # noqa: E402
                                               neighbor_fanouts)
from benchmarks.harness.memory import MemorySampler  # noqa: E402
from benchmarks.harness.process import free_port  # noqa: E402
from benchmarks.time_to_accuracy.models import DEPTH, LEARNING_RATE, Classifier, accuracies, build_model  # noqa: E402
from benchmarks.time_to_accuracy.worker import Epochs, exact_adjacency, start_run  # noqa: E402
from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule  # noqa: E402

LONG = timedelta(hours=2)


def stop_reason(spec: dict, rows: List[dict]) -> str:
    """Why a run of ``spec`` with these epoch records ended, replaying :class:`Stopper` on them (the rule Lightning's
    ``EarlyStopping`` applies inside the spawned ranks, where the launching process cannot read its state)."""
    stop = Stopper(spec)
    for e, row in enumerate(rows):
        if stop.done(row, e):
            return stop.why
    return stop.why if len(rows) >= stop.max_epochs else "budget"


class Stopper:
    """Early stopping on validation accuracy (``patience`` epochs without a strictly better one, Lightning's rule)
    and a budget of seconds."""

    def __init__(self, spec: dict) -> None:
        self.patience, self.budget = spec.get("patience"), spec.get("budget_s")
        self.max_epochs = spec.get("epochs") or spec["max_epochs"]
        self.fixed = spec.get("epochs") is not None
        self.best, self.wait, self.spent, self.why = float("-inf"), 0, 0.0, "max epochs"

    def done(self, row: dict, epoch: int) -> bool:
        """Whether to stop after ``epoch`` (0-based) whose record is ``row``."""
        self.spent += row["train_s"] + row["val_s"]
        if epoch + 1 >= self.max_epochs:
            return True
        if self.fixed:
            return False
        if row["val_acc"] > self.best:
            self.best, self.wait = row["val_acc"], 0
        else:
            self.wait += 1
        if self.patience is not None and self.wait >= self.patience:
            self.why = "early stopping"
            return True
        if self.budget is not None and self.spent >= self.budget:
            self.why = "budget"
            return True
        return False


def full_graph(model: torch.nn.Module, name: str, data) -> Callable[[], torch.Tensor]:
    """The exact full-graph forward of ``model`` on a CSR adjacency (GCNII's normalisation baked in)."""
    adj = exact_adjacency(model, name, data)
    return lambda: model(data.x, adj)


@torch.no_grad()
def validate(run: Callable[[], torch.Tensor], model: torch.nn.Module, data) -> dict:
    t0 = time.perf_counter()
    model.eval()
    val, test = accuracies(run(), data)
    model.train()
    return {"val_s": time.perf_counter() - t0, "val_acc": float(val), "test_acc": float(test)}


def train_epochs(spec: dict, data, model: torch.nn.Module, run: Callable[[], torch.Tensor],
                 epoch: Callable[[], dict]) -> List[dict]:
    """Run ``epoch()`` (training only; returns its record) then the exact validation ``run()``, until
    :class:`Stopper` says so."""
    rows, stop = [], Stopper(spec)
    for e in range(stop.max_epochs):
        t0 = time.perf_counter()
        row = epoch()
        row["train_s"] = time.perf_counter() - t0
        row.update(validate(run, model, data))
        rows.append(row)
        print(f"epoch {e}: {row}", flush=True)
        if stop.done(row, e):
            break
    spec["_stopped"] = stop.why
    return rows


def run_exact(spec: dict, data) -> List[dict]:
    """One full-graph Adam step an epoch in one process (2 threads)."""
    torch.set_num_threads(2)
    model = build_model(spec["model"], data.num_features, int(data.y.max()) + 1, spec["seed"])
    run = full_graph(model, spec["model"], data)
    opt = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE[spec["model"]])

    def epoch() -> dict:
        opt.zero_grad()
        loss = F.cross_entropy(run()[data.train_mask], data.y[data.train_mask])
        loss.backward()
        opt.step()
        return {"train_loss": float(loss.detach()), "steps": 1}

    return train_epochs(spec, data, model, run, epoch)


def run_cluster_gcn(spec: dict, data) -> List[dict]:
    """Cluster-GCN in one process (2 threads): an Adam step per batch of clusters, exact validation per epoch."""
    torch.set_num_threads(2)
    batches = ClusterBatches(data, num_parts=spec.get("cluster_parts", CLUSTER_PARTS),
                             batch_size=spec.get("cluster_batch", CLUSTER_BATCH), seed=spec["seed"])
    spec["_metis_s"] = batches.metis_s
    model = build_model(spec["model"], data.num_features, int(data.y.max()) + 1, spec["seed"])
    opt = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE[spec["model"]])

    def epoch() -> dict:
        total, labelled, steps, edges = 0.0, 0, 0, 0
        for batch in batches:
            edges += int(batch.edge_index.size(1))
            if not bool(batch.train_mask.any()):
                continue
            adj = exact_adjacency(model, spec["model"], batch)  # normalised on the batch's subgraph, as Cluster-GCN
            opt.zero_grad()
            loss = F.cross_entropy(model(batch.x, adj)[batch.train_mask], batch.y[batch.train_mask])
            loss.backward()
            opt.step()
            nodes = int(batch.train_mask.sum())
            total, labelled, steps = total + float(loss.detach()) * nodes, labelled + nodes, steps + 1
        return {"train_loss": total / max(labelled, 1), "steps": steps, "edges": edges}

    return train_epochs(spec, data, model, full_graph(model, spec["model"], data), epoch)


class Progress(Callback):
    """Print every validation's accuracy on rank 0 (the run's log)."""

    def on_validation_end(self, trainer, pl_module):
        if trainer.global_rank == 0 and not trainer.sanity_checking:
            print(f"epoch {trainer.current_epoch}: val_acc {float(trainer.callback_metrics.get('val_acc', -1)):.4f}",
                  flush=True)


class Budget(Callback):
    """Stop a Lightning fit once its epochs took ``budget_s`` seconds (decided on rank 0, the same on every rank)."""

    def __init__(self, budget_s: Optional[float]) -> None:
        self.budget_s, self.t0 = budget_s, None

    def on_train_start(self, trainer, pl_module):
        self.t0 = time.perf_counter()

    def on_validation_end(self, trainer, pl_module):
        if self.budget_s is None or trainer.sanity_checking:
            return
        over = time.perf_counter() - self.t0 >= self.budget_s
        if trainer.strategy.reduce_boolean_decision(over, all=False):
            trainer.should_stop = True


def run_gnnpipe(spec: dict, data, run_dir: Path) -> List[dict]:
    """``GNNPipeStrategy`` on 2 processes, with ``EarlyStopping`` on ``val_acc`` and the budget."""
    options = {"timeout": LONG, "exchange_timeout": LONG, **spec.get("strategy", {})}
    dm = GraphChunkDataModule(data, num_chunks=spec.get("chunks", 8), chunks_per_step=spec.get("chunks_per_step"),
                              chunk_groups=spec.get("chunk_groups", "fixed"))
    module = Classifier(build_model(spec["model"], data.num_features, int(data.y.max()) + 1, spec["seed"]),
                        LEARNING_RATE[spec["model"]])
    callbacks: List[Callback] = [Epochs(run_dir), Budget(spec.get("budget_s")), Progress()]
    if spec.get("epochs") is None and spec.get("patience") is not None:
        callbacks.append(EarlyStopping(monitor="val_acc", mode="max", patience=spec["patience"]))
    trainer = Trainer(accelerator="cpu", devices=2, strategy=GNNPipeStrategy(**options),
                      max_epochs=spec.get("epochs") or spec["max_epochs"], logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      callbacks=callbacks)
    trainer.fit(module, datamodule=dm)
    ranks = [json.loads((run_dir / f"epochs_rank{r}.json").read_text()) for r in range(2)]
    rows = ranks[0]
    for e, row in enumerate(rows):  # an epoch lasts as long as its slowest rank's
        row["train_s"] = max(r[e]["train_s"] for r in ranks)
        row["val_s"] = max(r[e]["val_s"] for r in ranks)
        row["steps"] = dm.steps_per_epoch
    spec["_stopped"] = stop_reason(spec, rows)
    return rows


def _neighbor_rank(rank: int, spec: dict, data, run_dir: Path, port: int) -> None:
    """One DDP rank: PyG's distributed_sampling example with this benchmark's model, loss and validation."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch_geometric.loader import NeighborLoader

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    sampler = MemorySampler(run_dir / f"mem_rank{rank}.json").start()
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=LONG)
    model = build_model(spec["model"], data.num_features, int(data.y.max()) + 1, spec["seed"])
    ddp = DistributedDataParallel(model)
    train_idx = data.train_mask.nonzero().view(-1)
    train_idx = train_idx.split(train_idx.size(0) // 2)[rank]
    layers = DEPTH[spec["model"]]
    loader = NeighborLoader(data, input_nodes=train_idx, num_neighbors=neighbor_fanouts(layers),
                            batch_size=NEIGHBOR_BATCH, shuffle=True, drop_last=True)
    run = full_graph(model, spec["model"], data) if rank == 0 else None
    opt = torch.optim.Adam(ddp.parameters(), lr=LEARNING_RATE[spec["model"]])
    rows, stop = [], Stopper(spec)
    for epoch in range(stop.max_epochs):
        t0, total, steps = time.perf_counter(), 0.0, 0
        for batch in loader:
            opt.zero_grad()
            adj = exact_adjacency(model, spec["model"], batch)  # CSR; GCNII's normalisation on the sampled subgraph
            out = ddp(batch.x, adj)[:batch.batch_size]
            loss = F.cross_entropy(out, batch.y[:batch.batch_size])
            loss.backward()
            opt.step()
            total, steps = total + float(loss.detach()), steps + 1
        dist.barrier()
        row = {"train_s": time.perf_counter() - t0, "train_loss": total / max(steps, 1), "steps": steps}
        if rank == 0:
            torch.set_num_threads(2)  # rank 1 waits: its core is free
            row.update(validate(run, model, data))
            torch.set_num_threads(1)
        verdict = torch.tensor([row.get("val_s", 0.0), row.get("val_acc", 0.0), row.get("test_acc", 0.0)])
        dist.broadcast(verdict, src=0)
        row.update(val_s=float(verdict[0]), val_acc=float(verdict[1]), test_acc=float(verdict[2]))
        rows.append(row)
        if rank == 0:
            print(f"epoch {epoch}: {row}", flush=True)
        if stop.done(row, epoch):
            break
    if rank == 0:
        (run_dir / "neighbor.json").write_text(json.dumps({"rows": rows, "stopped": stop.why}))
    dist.destroy_process_group()
    sampler.stop()


def run_neighbor_ddp(spec: dict, data, run_dir: Path) -> List[dict]:
    """Neighbour sampling under DDP on 2 processes (spawned, gloo)."""
    import torch.multiprocessing as mp

    import torch_geometric.typing as pyg_typing

    if not (pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE):
        raise RuntimeError("neighbor_ddp: NeighborLoader needs pyg-lib or torch-sparse; neither is installed")
    mp.spawn(_neighbor_rank, args=(spec, data, run_dir, free_port()), nprocs=2, join=True)
    out = json.loads((run_dir / "neighbor.json").read_text())
    spec["_stopped"] = out["stopped"]
    spec["_backend"] = "pyg-lib" if pyg_typing.WITH_PYG_LIB else "torch-sparse"
    return out["rows"]


def main(spec: dict, run_dir: Path) -> None:
    sampler, data, t0, graph_s = start_run(spec, run_dir)
    method = spec["method"]
    try:
        if method == "exact":
            rows = run_exact(spec, data)
        elif method == "cluster_gcn":
            rows = run_cluster_gcn(spec, data)
        elif method == "gnnpipe":
            rows = run_gnnpipe(spec, data, run_dir)
        elif method == "neighbor_ddp":
            rows = run_neighbor_ddp(spec, data, run_dir)
        else:
            raise ValueError(f"alternatives: unknown method {method!r}.")
    finally:
        sampler.stop()
    wall = time.perf_counter() - t0
    spent = sum(r["train_s"] + r["val_s"] for r in rows)
    result: Dict[str, object] = {"epochs": rows, "graph_s": graph_s, "wall_s": wall,
                                 "setup_s": wall - graph_s - spent, "stopped": spec.pop("_stopped", None),
                                 "num_edges": int(data.edge_index.size(1))}
    for key in ("_metis_s", "_backend"):
        if key in spec:
            result[key[1:]] = spec.pop(key)
    (run_dir / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), Path(sys.argv[2]))
