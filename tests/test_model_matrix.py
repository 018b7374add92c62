"""Every supported model under every strategy, each against an independent single-process reference.

Models: PyG ``GCN``, ``GraphSAGE``, ``GIN`` (sparse path), ``GAT`` (edge-list path), GCNII (the initial embedding
``x0`` travels beside ``h``) and a ``pipeline_blocks()`` model of residual ``DeepGCNLayer`` blocks (``ResGCN``).
Strategies: the GNNPipe default (2 stages, 4 chunks: 1F1B with the separable loss), graph parallelism (2 parts) and
hybrid parallelism (``graph_parallel_size=2``: 2 partitions of 2 chunks each, one stage).

One forked world per strategy fits every model in turn (plain SGD, so that a gradient wrong by any factor shows in
the losses), and every model's per-epoch training losses are compared with

* graph parallelism: single-device full-graph training of the unsplit model (exact);
* GNNPipe and hybrid: :func:`tests.reference.chunked_reference`, the chunked algorithm run the plain way on the
  unsplit layers (the pipeline rule; the hybrid rule with ``num_parts=2``).
"""

from __future__ import annotations

from typing import Callable, Dict, List

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, Trainer
from torch_geometric.nn.models import GAT, GCN, GIN, GraphSAGE

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, GraphParallelStrategy, find_layer_stack
from lightning_gnnpipe.nn.gcnii import GCNII
from tests.helpers import GNNModule, ResGCN, sbm_graph
from tests.reference import chunked_reference
from tests.world import run_world, values

F_IN, HIDDEN, C = 16, 16, 4
EPOCHS = 3
LR = 0.5
ATOL = 1e-5

MODELS: Dict[str, Callable[[], torch.nn.Module]] = {
    "gcn": lambda: GCN(F_IN, HIDDEN, 3, C),
    "sage": lambda: GraphSAGE(F_IN, HIDDEN, 3, C),
    "gin": lambda: GIN(F_IN, HIDDEN, 3, C),
    "gat": lambda: GAT(F_IN, 8, 3, C, heads=2),
    "gcnii": lambda: GCNII(F_IN, HIDDEN, C, num_layers=3, dropout=0.0),
    "resgcn": lambda: ResGCN(F_IN, HIDDEN, 2, C),
}

STRATEGIES = {  # name -> (processes, chunks, partitions, strategy)
    "gnnpipe": (2, 4, 1, GNNPipeStrategy),
    "graph_parallel": (2, 2, 2, GraphParallelStrategy),
    "hybrid": (2, 4, 2, lambda: GNNPipeStrategy(graph_parallel_size=2)),
}


class SGDModule(GNNModule):
    """The test helpers' LightningModule (cross-entropy on the training mask) with plain SGD."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def make_module(name: str) -> SGDModule:
    torch.manual_seed(0)
    return SGDModule(MODELS[name](), lr=LR)


class EpochLosses(Callback):
    def __init__(self) -> None:
        self.losses: List[float] = []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.losses.append(float(trainer.callback_metrics["train_loss"]))


def fit_every_model(strategy: Callable, dm: GraphChunkDataModule, devices: int) -> Dict[str, List[float]]:
    """On one rank: fit every model in turn with a fresh strategy; return each model's per-epoch losses."""
    out = {}
    for name in MODELS:
        record = EpochLosses()
        trainer = Trainer(accelerator="cpu", devices=devices, strategy=strategy(), max_epochs=EPOCHS, logger=False,
                          enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                          num_sanity_val_steps=0, limit_val_batches=0, callbacks=[record])
        trainer.fit(make_module(name), datamodule=dm)
        out[name] = record.losses
    return out


def single_device_losses(module: SGDModule, data) -> List[float]:
    """Full-graph training of the unsplit model in this process, the plain way."""
    opt = module.configure_optimizers()
    out = []
    for _ in range(EPOCHS):
        opt.zero_grad()
        logits = module(data.x, data.edge_index)
        loss = F.cross_entropy(logits[data.train_mask], data.y[data.train_mask])
        loss.backward()
        opt.step()
        out.append(float(loss))
    return out


def reference_losses(strategy: str, name: str, data, dm: GraphChunkDataModule) -> List[float]:
    module = make_module(name)
    if strategy == "graph_parallel":
        return single_device_losses(module, data)
    return chunked_reference(module, data, dm.plan, EPOCHS, layers=list(find_layer_stack(module).blocks),
                             num_parts=dm.num_parts)


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=240, num_classes=C, num_features=F_IN)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_model_equals_its_reference(graph, strategy):
    devices, chunks, parts, make_strategy = STRATEGIES[strategy]
    dm = GraphChunkDataModule(graph, num_chunks=chunks, num_parts=parts)
    ranks = values(run_world(devices, fit_every_model, make_strategy, dm, devices, timeout=300.0))
    for name in MODELS:
        got = ranks[0][name]
        assert len(got) == EPOCHS and all(r[name] == got for r in ranks), name  # every rank logs the same
        expected = reference_losses(strategy, name, graph, dm)
        assert expected[-1] < expected[0] - 1e-3, name  # the model trains: a frozen one could not fail
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0, msg=lambda m, n=name: f"{n}: {m}")
