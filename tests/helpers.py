"""Models, graphs and callbacks shared by the tests (importable by spawned workers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, LightningModule
from torch import nn
from torch_geometric.data import Data
from torch_geometric.nn import DeepGCNLayer, GCNConv
from torch_geometric.nn.models import GCN
from torch_geometric.utils import stochastic_blockmodel_graph

from lightning_gnnpipe.nn.stack import BlockStack, NodeWise


def needs_schedule(name: str):
    """Skip a test of schedule ``name`` on a torch that cannot run it, with the reason the strategy gives."""
    from lightning_gnnpipe.pipeline.schedule import unavailable

    why = unavailable(name)
    return pytest.mark.skipif(why is not None, reason=why or "")


def schedule_params(names):
    """``names`` as pytest params, each skipped on a torch that cannot run it (:func:`needs_schedule`)."""
    return [pytest.param(name, marks=needs_schedule(name)) for name in names]


@pytest.fixture()
def one_thread():
    """Run the test with one intra-op thread: on a busy 2-core machine two threads are 10-100x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def sbm_graph(num_nodes: int = 400, num_classes: int = 4, num_features: int = 16, seed: int = 0) -> Data:
    """A small stochastic-block-model graph with weakly informative features and a split."""
    g = torch.Generator().manual_seed(seed)
    sizes = [num_nodes // num_classes + (1 if i < num_nodes % num_classes else 0) for i in range(num_classes)]
    probs = torch.full((num_classes, num_classes), 0.01)
    probs.fill_diagonal_(0.08)
    torch.manual_seed(seed)
    edge_index = stochastic_blockmodel_graph(sizes, probs, directed=False)
    y = torch.arange(num_classes).repeat_interleave(torch.tensor(sizes))
    x = torch.randn(num_nodes, num_features, generator=g) + 0.5 * F.one_hot(y, num_features).float()
    perm = torch.randperm(num_nodes, generator=g)
    masks = [torch.zeros(num_nodes, dtype=torch.bool) for _ in range(3)]
    masks[0][perm[: num_nodes // 3]] = True
    masks[1][perm[num_nodes // 3: 2 * num_nodes // 3]] = True
    masks[2][perm[2 * num_nodes // 3:]] = True
    return Data(x=x, edge_index=edge_index, y=y, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])


class GCNModule(LightningModule):
    """An ordinary PyG LightningModule, as a user would write it."""

    def __init__(self, in_channels: int, hidden: int, num_layers: int, out_channels: int, lr: float = 0.01,
                 seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(seed)
        self.gnn = GCN(in_channels, hidden, num_layers, out_channels)

    def forward(self, x, edge_index):
        return self.gnn(x, edge_index)

    def training_step(self, batch, batch_idx):
        out = self(batch.x, batch.edge_index)
        loss = F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])
        self.log("train_loss", loss, batch_size=1, on_epoch=True, on_step=False)
        return loss

    def _acc(self, batch, mask, name):
        out = self(batch.x, batch.edge_index)
        acc = (out[mask].argmax(-1) == batch.y[mask]).float().mean()
        self.log(name, acc, batch_size=1)
        return acc

    def validation_step(self, batch, batch_idx):
        return self._acc(batch, batch.val_mask, "val_acc")

    def test_step(self, batch, batch_idx):
        return self._acc(batch, batch.test_mask, "test_acc")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class ChunkLossGCN(GCNModule):
    """The same module with the per-chunk loss hook that 1F1B needs."""

    def pipeline_chunk_loss(self, out, batch, node_index):
        mask = batch.train_mask[node_index]
        return F.cross_entropy(out[mask], batch.y[node_index][mask], reduction="sum") / batch.train_mask.sum()


class GNNModule(GCNModule):
    """The same LightningModule around any GNN ``model(x, edge_index)`` built by the caller."""

    def __init__(self, model: nn.Module, lr: float = 0.01) -> None:
        LightningModule.__init__(self)
        self.save_hyperparameters({"lr": lr})
        self.gnn = model


class ResGCN(BlockStack):
    """Residual GCN with LayerNorm and dropout (DeepGCN 'res+' layers), declared as pipeline blocks.

    Blocks: a node-wise input ``Linear``, ``num_layers`` ``DeepGCNLayer(GCNConv)`` and a
    node-wise output ``Linear``.
    """

    def __init__(self, in_channels: int, hidden: int, num_layers: int, out_channels: int,
                 dropout: float = 0.0) -> None:
        layers = [DeepGCNLayer(GCNConv(hidden, hidden), nn.LayerNorm(hidden), nn.ReLU(), block="res+",
                               dropout=dropout) for _ in range(num_layers)]
        super().__init__([NodeWise(nn.Linear(in_channels, hidden))] + layers
                         + [NodeWise(nn.Linear(hidden, out_channels))])


class MetricRecorder(Callback):
    """Write every epoch's logged metrics of this rank to ``<dir>/metrics.rank<r>.json``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.epochs: List[dict] = []

    def on_train_epoch_end(self, trainer, pl_module):
        self.epochs.append({k: float(v) for k, v in trainer.callback_metrics.items()})

    def on_fit_end(self, trainer, pl_module):
        Path(self.directory).mkdir(parents=True, exist_ok=True)
        path = Path(self.directory) / f"metrics.rank{trainer.global_rank}.json"
        path.write_text(json.dumps(self.epochs))


def read_metrics(directory: str, rank: int = 0) -> List[dict]:
    return json.loads((Path(directory) / f"metrics.rank{rank}.json").read_text())


def fit(directory: str, module: LightningModule, datamodule, devices: int = 2, strategy=None, epochs: int = 5,
        launcher: str = "fork", **trainer_kwargs) -> List[List[dict]]:
    """Fit with ``devices`` processes (or a plain single-device Trainer when ``strategy`` is None).

    With a strategy, ``launcher="fork"`` (default) runs ``Trainer.fit`` on every rank of a world of
    forked processes (:func:`tests.world.run_world`, the torchrun way: the strategy's launcher does
    nothing), about 1 s of start-up instead of the 5-20 s of spawning fresh interpreters;
    ``launcher="spawn"`` lets the strategy's own launcher spawn them, as a user's script does.

    Returns the per-epoch metrics of every rank.
    """
    if launcher not in ("fork", "spawn"):
        raise ValueError(f"launcher must be 'fork' or 'spawn' (got {launcher!r})")
    if strategy is not None and launcher == "fork":
        from tests.world import run_world, values

        values(run_world(devices, _fit_here, directory, module, datamodule, devices, strategy, epochs,
                         trainer_kwargs, timeout=300.0))
        return [read_metrics(directory, r) for r in range(devices)]
    _fit_here(directory, module, datamodule, devices, strategy, epochs, trainer_kwargs)
    return [read_metrics(directory, r) for r in range(devices)]


def _fit_here(directory: str, module: LightningModule, datamodule, devices: int, strategy, epochs: int,
              trainer_kwargs: dict) -> None:
    from lightning.pytorch import Trainer

    kwargs = dict(accelerator="cpu", devices=devices, max_epochs=epochs, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                  callbacks=[MetricRecorder(directory)])
    if strategy is not None:
        kwargs["strategy"] = strategy
    kwargs.update(trainer_kwargs)
    trainer = Trainer(**kwargs)
    trainer.fit(module, datamodule=datamodule)


def losses(metrics: List[dict], key: str = "train_loss") -> List[float]:
    return [m[key] for m in metrics]


class GCNIIModule(GCNModule):
    """``GCNModule`` with a GCNII stack (h0 travels through the stages)."""

    def __init__(self, in_channels: int, hidden: int, num_layers: int, out_channels: int, lr: float = 0.01,
                 seed: int = 0) -> None:
        super().__init__(in_channels, hidden, 1, out_channels, lr, seed)
        from lightning_gnnpipe.nn.gcnii import GCNII

        torch.manual_seed(seed)
        self.gnn = GCNII(in_channels, hidden, out_channels, num_layers, dropout=0.0)
