"""Lightning integration: logging, TensorBoard, checkpoints, registry name (resume: ``tests/test_checkpoint.py``)."""

import glob
import os

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule
from lightning_gnnpipe.strategy.checkpoint import read_history_tables
from tests.helpers import (ChunkLossGCN, GCNModule, MetricRecorder, fit, losses, needs_schedule, read_metrics,
                           sbm_graph)
from tests.world import run_world, values


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=300)


def _trainer(tmp_path, epochs, **kwargs):
    base = dict(accelerator="cpu", devices=2, strategy=GNNPipeStrategy(), max_epochs=epochs,
                enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    base.update(kwargs)
    return Trainer(**base)


def _plain_from_checkpoint(path, cls, graph):
    """Load a checkpoint strictly into the unsplit ``cls(16, 32, 4, 4)``; return (checkpoint, module, logits)."""
    state = torch.load(path, weights_only=False)
    plain = cls(16, 32, 4, 4)
    plain.load_state_dict(state["state_dict"], strict=True)
    plain.eval()
    with torch.no_grad():
        return state, plain, plain(graph.x, graph.edge_index)


def test_tensorboard_run_and_checkpoint(tmp_path, graph):
    dm = GraphChunkDataModule(graph, num_chunks=4)
    module = GCNModule(16, 32, 4, 4)
    logger = TensorBoardLogger(str(tmp_path), name="run")
    last = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)
    best = ModelCheckpoint(dirpath=str(tmp_path / "best"), monitor="val_acc", mode="max")  # needs val_acc on all ranks
    trainer = _trainer(tmp_path, 4, logger=logger, callbacks=[last, best, MetricRecorder(str(tmp_path))],
                       log_every_n_steps=1)
    trainer.fit(module, datamodule=dm)
    test_acc = trainer.test(module, datamodule=dm, verbose=False)[0]["test_acc"]

    runs = glob.glob(str(tmp_path / "run" / "version_*"))
    assert len(runs) == 1
    scalars = {}
    for f in glob.glob(os.path.join(runs[0], "events.*")):
        acc = EventAccumulator(f)
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            scalars[tag] = [e.value for e in acc.Scalars(tag)]
    assert {"train_loss", "val_acc", "test_acc"} <= set(scalars)
    last_stage = losses(read_metrics(str(tmp_path), rank=1))
    torch.testing.assert_close(scalars["train_loss"], last_stage, atol=1e-6, rtol=0)

    # The checkpoint holds every stage under the original names and loads strictly into the plain module.
    state, plain, out = _plain_from_checkpoint(str(tmp_path / "ckpt" / "last.ckpt"), GCNModule, graph)
    acc = (out[graph.test_mask].argmax(-1) == graph.y[graph.test_mask]).float().mean()
    assert float(acc) == pytest.approx(test_acc, abs=1e-6)
    num_params = len(list(plain.parameters()))
    opt_state = state["optimizer_states"][0]["state"]
    assert sorted(opt_state) == list(range(num_params))  # every stage's Adam state
    assert all(int(s["step"]) == 4 for s in opt_state.values())


def test_registered_name(tmp_path, graph):
    dm = GraphChunkDataModule(graph, num_chunks=2)
    metrics = fit(str(tmp_path), GCNModule(16, 32, 2, 4), dm, strategy="gnnpipe", epochs=1)
    assert len(metrics) == 2 and metrics[0] == metrics[1]


class ProbeGCN(ChunkLossGCN):
    """Also logs a continuous probe of the validation logits (accuracy alone is coarse)."""

    def validation_step(self, batch, batch_idx):
        out = self(batch.x, batch.edge_index)
        self.log("val_probe", probe(out), batch_size=1)
        return super().validation_step(batch, batch_idx)


def probe(out):
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    return (out * weights).sum()


@needs_schedule("zbv")
def test_multi_stage_checkpoint_and_exact_eval(tmp_path, graph):
    # zbv: rank 0 holds stages 0 and 3 (layers 0 and 3, and the loss), rank 1 stages 1 and 2.
    dm = GraphChunkDataModule(graph, num_chunks=4)
    module = ProbeGCN(16, 32, 4, 4)
    last = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)
    strategy = GNNPipeStrategy(schedule="zbv", stages_per_rank=2, save_history=True)

    def job():
        trainer = _trainer(tmp_path, 3, strategy=strategy, logger=False, callbacks=[last])
        trainer.fit(module, datamodule=dm)
        return trainer.validate(module, datamodule=dm, verbose=False)[0]

    metrics = values(run_world(2, job))[0]  # forked ranks, the torchrun way (no launcher)

    # Eval through the stages equals the unsplit model with the checkpoint's weights.
    state, plain, out = _plain_from_checkpoint(str(tmp_path / "ckpt" / "last.ckpt"), ProbeGCN, graph)
    assert metrics["val_probe"] == pytest.approx(float(probe(out)), rel=1e-5)
    acc = (out[graph.val_mask].argmax(-1) == graph.y[graph.val_mask]).float().mean()
    assert float(acc) == pytest.approx(metrics["val_acc"], abs=1e-6)
    opt_state = state["optimizer_states"][0]["state"]
    assert sorted(opt_state) == list(range(len(list(plain.parameters()))))  # every stage's Adam state
    assert all(int(s["step"]) == 3 for s in opt_state.values())
    saved = state["gnnpipe"]  # both stages of each rank: their layers and their history tables
    assert saved["layers"] == [[0, 3], [1, 2]]
    rows = torch.cat(dm.plan.halo).unique().numel()  # tables keep the boundary nodes' rows
    tables = read_history_tables(str(tmp_path / "ckpt" / "last.ckpt"))
    assert {k: tuple(v.shape) for k, v in tables.items()} == {f"partition0/layer{k}": (rows, 32) for k in (1, 2, 3)}
