"""Modules and callbacks for the precision, clipping and insight tests (importable by spawned workers)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback
from torchmetrics.classification import MulticlassAccuracy

from tests.helpers import GCNModule


class SGDGCN(GCNModule):
    """``GCNModule`` with plain SGD, whose steps scale with the gradient (Adam's would not see clipping)."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class MetricGCN(GCNModule):
    """``GCNModule`` that logs a torchmetrics accuracy on the labelled nodes, loss on the progress bar."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.train_acc = MulticlassAccuracy(num_classes=self.hparams.out_channels, average="micro")

    def training_step(self, batch, batch_idx):
        out = self(batch.x, batch.edge_index)
        mask = batch.train_mask
        loss = F.cross_entropy(out[mask], batch.y[mask])
        self.train_acc(out[mask].argmax(-1), batch.y[mask])
        self.log("train_loss", loss, batch_size=1, on_epoch=True, on_step=False, prog_bar=True)
        self.log("train_acc", self.train_acc, batch_size=1, on_epoch=True, on_step=False, prog_bar=True)
        plain = (out[mask].argmax(-1) == batch.y[mask]).float().mean()
        self.log("train_acc_plain", plain, batch_size=1, on_epoch=True, on_step=False)
        return loss


class ProgressBarRecorder(Callback):
    """Write the progress bar's metric names of this rank to ``<dir>/progress_bar.rank<r>.json``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def on_train_end(self, trainer, pl_module):
        Path(self.directory).mkdir(parents=True, exist_ok=True)
        path = Path(self.directory) / f"progress_bar.rank{trainer.global_rank}.json"
        path.write_text(json.dumps(sorted(trainer.progress_bar_metrics)))
