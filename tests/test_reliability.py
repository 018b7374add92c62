"""Determinism, callbacks and odd graphs, on worlds of forked gloo ranks (checkpoints and resume:
``tests/test_checkpoint.py``).

Every run here goes through ``Trainer.fit`` with ``GNNPipeStrategy`` on every rank of a world
made by :func:`tests.world.run_world` (the torchrun way: the processes exist, the strategy's
launcher does nothing), which costs about 1 s per run instead of the 15-25 s of spawning
fresh interpreters on a loaded 2-core machine.
"""

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from lightning_gnnpipe import GraphChunkDataModule
from tests.helpers import ChunkLossGCN, GCNModule, MetricRecorder, sbm_graph
from tests.reference import layer_major_reference
from tests.scenarios import (DropoutGCN, MeanChunkLossGCN, RankDependentGCN, callback_summary, callbacks_job,
                             losses_job)
from tests.world import run_world, values


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=300)


def _last_stage(results):
    return values(results)[-1]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_same_seed_same_losses(graph, schedule):
    dm = GraphChunkDataModule(graph, num_chunks=4)
    runs = [_last_stage(run_world(2, losses_job, DropoutGCN(16, 32, 4, 4), dm, 2, 4,
                                  strategy_kwargs={"schedule": schedule})) for _ in range(2)]
    assert len(runs[0]) == 4 and runs[0] == runs[1]


def test_checkpoint_and_early_stopping_as_on_one_device(tmp_path, graph):
    """``ModelCheckpoint``/``EarlyStopping`` on ``val_acc`` decide as on one device (K = 1 is exact)."""
    dm = GraphChunkDataModule(graph, num_chunks=1)
    pipe = values(run_world(2, callbacks_job, GCNModule(16, 32, 4, 4, lr=0.05), dm, 2, 40, str(tmp_path / "p")))
    stop = EarlyStopping(monitor="val_acc", mode="max", patience=2)
    best = ModelCheckpoint(dirpath=str(tmp_path / "s"), monitor="val_acc", mode="max", filename="{epoch}")
    rec = MetricRecorder(str(tmp_path / "s"))
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=40, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, callbacks=[rec, stop, best])
    trainer.fit(GCNModule(16, 32, 4, 4, lr=0.05), datamodule=dm)
    single = callback_summary(trainer, stop, best, rec.epochs)
    assert 0 < single["stopped_epoch"] < 39  # it did stop early
    assert pipe[0] == pipe[1]
    assert {k: v for k, v in pipe[0].items() if k != "val_acc"} == {k: v for k, v in single.items()
                                                                    if k != "val_acc"}
    assert pipe[0]["val_acc"] == pytest.approx(single["val_acc"], abs=1e-6)


def test_chunk_without_training_nodes_adds_zero(graph):
    """A chunk with no training node runs and adds exactly zero (a per-chunk mean would be NaN)."""
    part = torch.randint(1, 3, (300,), generator=torch.Generator().manual_seed(0))
    part[~graph.train_mask] = torch.randint(0, 3, (int((~graph.train_mask).sum()),),
                                            generator=torch.Generator().manual_seed(1))
    dm = GraphChunkDataModule(graph, num_chunks=3, part=part)
    assert any(not bool(graph.train_mask[nodes].any()) for nodes in dm.plan.nodes)  # chunks may be renumbered
    ref = layer_major_reference(ChunkLossGCN(16, 32, 4, 4), graph, dm.plan, 4, refresh_every=1,  # the defaults
                                halo_gradients="fresh")
    got = _last_stage(run_world(2, losses_job, MeanChunkLossGCN(16, 32, 4, 4), dm, 2, 4,
                                strategy_kwargs={"schedule": "1f1b"}))
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)


def test_isolated_nodes_self_loops_duplicate_and_directed_edges(graph):
    """Such graphs train, and exactly as the single-process reference (message direction kept)."""
    g = graph.clone()
    ei = g.edge_index
    keep = torch.rand(ei.size(1), generator=torch.Generator().manual_seed(2)) < 0.6  # directed: drop one way
    ei = ei[:, keep]
    ei = ei[:, (ei < 290).all(0)]  # nodes 290..299 become isolated
    g.edge_index = torch.cat([ei, torch.tensor([[3, 3, 7, 7, 10], [3, 3, 8, 8, 10]])], dim=1)  # loops, duplicates
    dm = GraphChunkDataModule(g, num_chunks=3)
    ref = layer_major_reference(GCNModule(16, 32, 4, 4), g, dm.plan, 4, refresh_every=1,  # the defaults
                                halo_gradients="fresh")
    got = _last_stage(run_world(2, losses_job, GCNModule(16, 32, 4, 4), dm, 2, 4))
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)


def test_stage_width_mismatch_raises_on_every_rank(graph):
    dm = GraphChunkDataModule(graph, num_chunks=2)
    results = run_world(2, losses_job, RankDependentGCN(16, 32, 4, 4), dm, 2, 1, timeout=60)
    for r in results:
        assert r.exitcode == 1 and r.seconds < 30
        assert "stage 0 sends embeddings of widths [32] but stage 1 expects widths [24]" in r.error


