"""Training runs executed on every rank of a :func:`tests.world.run_world` world.

Shared by ``tests/test_reliability.py``, ``tests/test_failures.py`` and
``checks/stress.py``. Each job builds its own ``Trainer`` on the rank it runs on and
returns plain values (this rank's per-epoch metrics and what the test needs).
"""

from __future__ import annotations

import os
import signal
import warnings
import sys
import time
from datetime import timedelta
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from torch_geometric.nn.models import GCN

from tests.helpers import ChunkLossGCN, GCNModule, MetricRecorder, losses


class DropoutGCN(ChunkLossGCN):
    """GCN with dropout (draws from every stage's generator), a step LR schedule and the chunk loss."""

    def __init__(self, in_channels: int, hidden: int, num_layers: int, out_channels: int, lr: float = 0.01,
                 seed: int = 0, dropout: float = 0.3) -> None:
        super().__init__(in_channels, hidden, num_layers, out_channels, lr=lr, seed=seed)
        torch.manual_seed(seed)
        self.gnn = GCN(in_channels, hidden, num_layers, out_channels, dropout=dropout)

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)]


class MeanChunkLossGCN(GCNModule):
    """A chunk loss written as the chunk's masked mean times its share of the training nodes.

    Correct on chunks with training nodes; on a chunk without any it is ``0 / 0``, NaN in value
    and in gradient (which would poison every weight) unless the strategy skips the chunk.
    """

    def pipeline_chunk_loss(self, out, batch, node_index):
        w = batch.train_mask[node_index].float()
        per_node = F.cross_entropy(out, batch.y[node_index], reduction="none")
        return (per_node * w).sum() / w.sum() * (w.sum() / batch.train_mask.sum())


class RankDependentGCN(GCNModule):
    """A model that is (wrongly) built differently on rank 1: stage widths disagree."""

    def setup(self, stage: str) -> None:
        if self.global_rank == 1:
            torch.manual_seed(0)
            self.gnn = GCN(self.hparams.in_channels, self.hparams.hidden - 8, self.hparams.num_layers,
                           self.hparams.out_channels)


class FailingGCN(GCNModule):
    """Fails on rank ``fail_rank`` in epoch 1, mid-pipeline (inside the last stage's loss).

    ``mode`` is ``"raise"`` (a Python exception), ``"kill"`` (SIGKILL to its own process) or
    ``"stop"`` (SIGSTOP: the rank hangs with its connections open, so only the process-group
    timeout can end its peers); ``"layer"`` raises a ``ValueError`` in the first layer's forward
    instead, on the rank of stage 0, inside torch's pipeline stage; ``"validation"`` raises a
    ``RuntimeError`` in ``validation_step`` (epoch 1's, after the exact forward through the stages).
    On a rank without the last stage, ``training_step`` runs after the pipeline step, on the broadcast
    logits: ``"raise"`` fails there.
    """

    def __init__(self, *args: Any, mode: str = "raise", fail_rank: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mode, self.fail_rank = mode, fail_rank
        if mode == "layer":  # a ValueError inside the first layer, i.e. inside stage 0's forward
            self.gnn.convs[0].register_forward_pre_hook(self._fail_in_layer)

    def _fail_in_layer(self, module, inputs) -> None:
        if self.training and self.current_epoch == 1:
            raise ValueError("injected failure in a layer's forward")

    def _failing_now(self) -> bool:
        """Whether this rank fails now; if so, stamp the moment in stderr (``tests/test_failures.py`` reads it)."""
        failing = self.global_rank == self.fail_rank and self.current_epoch == 1
        if failing:
            print(f"FailingGCN: failing ({self.mode}) at {time.time():.3f}", file=sys.stderr, flush=True)
        return failing

    def validation_step(self, batch, batch_idx):
        if self.mode == "validation" and self._failing_now():
            raise RuntimeError("injected failure in validation_step")
        return super().validation_step(batch, batch_idx)

    def training_step(self, batch, batch_idx):
        if self.mode in ("layer", "validation"):
            return super().training_step(batch, batch_idx)
        if self._failing_now():
            if self.mode in ("kill", "stop"):
                os.kill(os.getpid(), signal.SIGKILL if self.mode == "kill" else signal.SIGSTOP)
            raise RuntimeError("injected failure in training_step")
        return super().training_step(batch, batch_idx)


class _EpochMetrics(MetricRecorder):
    """Keep every epoch's metrics in memory only (the job returns them)."""

    def on_fit_end(self, trainer, pl_module) -> None:
        pass


def fit_rank(module, datamodule, devices: int, epochs: int, strategy_kwargs: Optional[Dict[str, Any]] = None,
             ckpt_dir: Optional[str] = None, ckpt_path: Optional[str] = None, callbacks: Optional[list] = None,
             strategy_cls: Optional[type] = None, **trainer_kwargs: Any) -> Dict[str, Any]:
    """Fit on this rank with ``GNNPipeStrategy`` (``devices`` stages, no launcher: the world exists).

    ``strategy_cls`` (e.g. ``GraphParallelStrategy``) replaces ``GNNPipeStrategy``; ``strategy_kwargs`` go to it.
    With ``ckpt_dir`` a checkpoint ``epoch=<e>.ckpt`` is written after every epoch.

    Returns:
        ``{"metrics": per-epoch logged metrics, "losses": train losses, "callbacks": callbacks}``.
    """
    from lightning_gnnpipe import GNNPipeStrategy

    rec = _EpochMetrics("")
    cbs: List[Any] = [rec] + list(callbacks or [])
    if ckpt_dir is not None:
        cbs.append(ModelCheckpoint(dirpath=ckpt_dir, filename="{epoch}", save_top_k=-1, every_n_epochs=1))
    kwargs = dict(accelerator="cpu", devices=devices, max_epochs=epochs, logger=False,
                  enable_checkpointing=ckpt_dir is not None or any(isinstance(c, ModelCheckpoint) for c in cbs),
                  enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, callbacks=cbs,
                  strategy=(strategy_cls or GNNPipeStrategy)(**(strategy_kwargs or {})))
    kwargs.update(trainer_kwargs)
    trainer = Trainer(**kwargs)
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    return {"metrics": rec.epochs, "losses": losses(rec.epochs), "trainer": trainer}


def losses_job(module, datamodule, devices: int, epochs: int, **kwargs: Any) -> List[float]:
    """Fit and return this rank's per-epoch training losses."""
    return fit_rank(module, datamodule, devices, epochs, **kwargs)["losses"]


def warnings_job(module, datamodule, devices: int, epochs: int, **kwargs: Any) -> List[str]:
    """Fit and return the message of every warning this rank gave (``rank_zero_warn``: rank 0's)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit_rank(module, datamodule, devices, epochs, **kwargs)
    return [str(w.message) for w in caught]


def callbacks_job(module, datamodule, devices: int, epochs: int, directory: str) -> Dict[str, Any]:
    """Fit with ``ModelCheckpoint(monitor="val_acc")`` and ``EarlyStopping(monitor="val_acc")``."""
    stop = EarlyStopping(monitor="val_acc", mode="max", patience=2)
    best = ModelCheckpoint(dirpath=directory, monitor="val_acc", mode="max", filename="{epoch}")
    out = fit_rank(module, datamodule, devices, epochs, callbacks=[stop, best])
    return callback_summary(out["trainer"], stop, best, out["metrics"])


def callback_summary(trainer, stop, best, metrics) -> Dict[str, Any]:
    return {"epochs_run": trainer.current_epoch, "stopped_epoch": stop.stopped_epoch,
            "best_score": float(best.best_model_score), "best_file": os.path.basename(best.best_model_path),
            "val_acc": [m["val_acc"] for m in metrics]}


def rewrite_history(src, dst, history: Optional[Dict[int, torch.Tensor]] = None) -> str:
    """Copy checkpoint ``src`` to ``dst`` with its tables replaced by inline ``history`` (``None``: none saved)."""
    from lightning_gnnpipe.strategy.checkpoint import CHECKPOINT_KEY

    state = torch.load(src, weights_only=True)
    state[CHECKPOINT_KEY]["history"] = history  # inline tables, as older checkpoints hold them
    state[CHECKPOINT_KEY]["history_tables"] = None
    torch.save(state, dst)
    return str(dst)


def failing_job(datamodule, mode: str, timeout_s: float, fail_rank: int = 1, option: str = "timeout") -> None:
    """Fit a 2-stage model whose rank ``fail_rank`` fails in epoch 1 (see :class:`FailingGCN`).

    ``timeout_s`` is given as the strategy's ``option`` (``"timeout"`` or ``"exchange_timeout"``, the other one
    keeps its default). Validation runs only in mode ``"validation"`` (the failure is in it).
    """
    fit_rank(FailingGCN(16, 16, 2, 4, mode=mode, fail_rank=fail_rank), datamodule, 2, 3,
             strategy_kwargs={option: timedelta(seconds=timeout_s)},
             limit_val_batches=1.0 if mode == "validation" else 0)
