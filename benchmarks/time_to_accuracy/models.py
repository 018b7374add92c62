"""The models of the time-to-accuracy benchmark and the ordinary LightningModule around them.

* ``ressage8``: a residual GraphSAGE: an input ``Linear``, 8 PyG ``DeepGCNLayer(SAGEConv, LayerNorm, ReLU,
  block="res+")`` (Li et al., arXiv 2006.07739) and an output ``Linear``, hidden 64, declared to the pipeline as
  blocks (:class:`lightning_gnnpipe.nn.stack.BlockStack`); Adam, lr 0.003 (at 0.01 its loss first triples). (PyG's plain ``GraphSAGE`` with 8 layers
  and a per-node ``LayerNorm`` sat at chance for 30 to 50 epochs on this graph before it learned, at a point that
  moved from run to run: no basis for a time to accuracy.)
* ``gcnii16``: GCNII (Chen et al., ICML 2020, arXiv 2007.02133), 16 layers, hidden 64, alpha 0.1, theta 0.5
  (:class:`lightning_gnnpipe.nn.gcnii.GCNII`; Adam, lr 0.01).
* ``mlp``: a 3-layer MLP on the node's own features (the baseline that shows the labels need neighbours).

No dropout anywhere: every mode then computes the same function of the weights.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import nn
from torch_geometric.nn import DeepGCNLayer, SAGEConv
from torch_geometric.nn.models import MLP

from lightning_gnnpipe.nn.gcnii import GCNII
from lightning_gnnpipe.nn.stack import BlockStack, NodeWise

MODELS = ("ressage8", "gcnii16", "mlp")
LEARNING_RATE = {"ressage8": 0.003, "gcnii16": 0.01, "mlp": 0.01}
DEPTH = {"ressage8": 8, "gcnii16": 16, "mlp": 3}


def build_model(name: str, in_channels: int, num_classes: int, seed: int, hidden: int = 64) -> nn.Module:
    """The model ``name`` (:data:`MODELS`), initialised from ``seed``."""
    torch.manual_seed(seed)
    if name == "ressage8":
        layers = [DeepGCNLayer(SAGEConv(hidden, hidden), nn.LayerNorm(hidden), nn.ReLU(), block="res+")
                  for _ in range(8)]
        return BlockStack([NodeWise(nn.Linear(in_channels, hidden))] + layers
                          + [NodeWise(nn.Linear(hidden, num_classes))])
    if name == "gcnii16":
        return GCNII(in_channels, hidden, num_classes, 16, alpha=0.1, theta=0.5, dropout=0.0)
    if name == "mlp":
        return MLP([in_channels, hidden, hidden, num_classes], norm=None)
    raise ValueError(f"time_to_accuracy: unknown model {name!r}. Use one of {MODELS}.")


def accuracies(out: torch.Tensor, batch) -> Tuple[torch.Tensor, torch.Tensor]:
    """Validation and test accuracy of the logits ``(|V|, C)``."""
    pred = out.argmax(-1)
    return tuple((pred[m] == batch.y[m]).float().mean() for m in (batch.val_mask, batch.test_mask))


def lr_scheduler(opt: torch.optim.Optimizer, schedule: Optional[str], epochs: int):
    """``schedule`` for ``opt``, stepped once per epoch: ``"cosine"`` anneals to 0 over ``epochs``; ``None``: constant
    (returns ``None``)."""
    if schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    if schedule is not None:
        raise ValueError(f"time_to_accuracy: unknown lr_schedule {schedule!r}. Use 'cosine' or none.")
    return None


class Classifier(LightningModule):
    """An ordinary PyG LightningModule: cross-entropy on ``train_mask``, validation and test accuracy of one forward."""

    def __init__(self, model: nn.Module, lr: float, schedule: Optional[str] = None, epochs: int = 0) -> None:
        super().__init__()
        self.gnn, self.lr, self.schedule, self.epochs = model, lr, schedule, epochs

    def forward(self, x, edge_index):
        return self.gnn(x, edge_index)

    def training_step(self, batch, batch_idx):
        out = self(batch.x, batch.edge_index)
        loss = F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])
        self.log("train_loss", loss, batch_size=1, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        val, test = accuracies(self(batch.x, batch.edge_index), batch)
        self.log_dict({"val_acc": val, "test_acc": test}, batch_size=1)

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.lr)
        sched = lr_scheduler(opt, self.schedule, self.epochs)
        return opt if sched is None else {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}
