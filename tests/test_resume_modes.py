"""Resume under 1F1B, ZBV (two stages per rank) and graph parallelism, on worlds of forked gloo ranks.

Each run trains ``EPOCHS`` epochs uninterrupted (checkpoint after every epoch) and is compared with the
single-process references of ``tests/reference.py``; a second run resumes from the checkpoint written after
epoch ``SAVED`` and must continue bit for bit. A pipeline checkpoint stripped of its history tables must resume
as the reference that refills the tables exactly at the resume epoch (``refresh_at``), which is measurably not
the uninterrupted curve: so the test tells whether the refresh on resume ran.
"""

import pytest
import torch

from lightning_gnnpipe import GraphChunkDataModule, GraphParallelStrategy
from tests.helpers import ChunkLossGCN, GCNModule, sbm_graph
from tests.reference import chunked_reference
from tests.scenarios import losses_job, rewrite_history
from tests.world import run_world, values

EPOCHS = 5
SAVED = 1  # epoch=1.ckpt is written after the second epoch ...
RESUMED = SAVED + 1  # ... and the resumed run trains epochs 2, 3, 4
TIGHT = 1e-6  # |loss difference| allowed between a run and its single-process reference
PIPELINES = {"1f1b": {"schedule": "1f1b"}, "zbv": {"schedule": "zbv", "stages_per_rank": 2}}


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=300)


def _losses(dm, module_cls=ChunkLossGCN, **kwargs):
    """Per-epoch training losses of a 2-process fit (every rank logs the same broadcast loss)."""
    out = values(run_world(2, losses_job, module_cls(16, 32, 4, 4), dm, 2, EPOCHS, **kwargs))
    assert out[0] == out[1]
    return out[0]


@pytest.mark.parametrize("name", PIPELINES)
def test_pipeline_resume_with_and_without_history_tables(tmp_path, graph, name):
    dm = GraphChunkDataModule(graph, num_chunks=4)
    opts = PIPELINES[name]
    ckpt = tmp_path / "ckpt"
    saved = str(ckpt / f"epoch={SAVED}.ckpt")
    full = _losses(dm, ckpt_dir=str(ckpt), strategy_kwargs={**opts, "save_history": True})
    torch.testing.assert_close(full, chunked_reference(ChunkLossGCN(16, 32, 4, 4), graph, dm.plan, EPOCHS),
                               atol=TIGHT, rtol=0)

    resumed = _losses(dm, ckpt_path=saved, strategy_kwargs={**opts, "save_history": True})
    assert resumed == full[RESUMED:]  # bit for bit

    # Without the tables the resume refills them exactly with the saved weights.
    bare = _losses(dm, ckpt_path=rewrite_history(saved, tmp_path / "bare.ckpt"), strategy_kwargs=opts)
    refreshed = chunked_reference(ChunkLossGCN(16, 32, 4, 4), graph, dm.plan, EPOCHS, refresh_at={RESUMED})
    effect = max(abs(a - b) for a, b in zip(refreshed[RESUMED:], full[RESUMED:]))
    error = max(abs(a - b) for a, b in zip(bare, refreshed[RESUMED:]))
    print(f"{name}: resume without tables: max |loss - refreshed reference| = {error:.2e}; the refresh moves "
          f"the reference by {effect:.2e}")
    assert effect > 100 * TIGHT  # the refresh at the resume epoch is visible in the losses
    torch.testing.assert_close(bare, refreshed[RESUMED:], atol=TIGHT, rtol=0)


def test_graph_parallel_resume(tmp_path, graph):
    """K = G = 2: exact full-graph training (no tables); the resumed run continues bit for bit."""
    dm = GraphChunkDataModule(graph, num_chunks=2)
    ckpt = tmp_path / "ckpt"
    run = dict(module_cls=GCNModule, strategy_cls=GraphParallelStrategy)
    full = _losses(dm, ckpt_dir=str(ckpt), **run)
    # one slot of both chunks: every row is read live, i.e. single-device full-graph training
    exact = chunked_reference(GCNModule(16, 32, 4, 4), graph, dm.plan, EPOCHS, num_parts=2)
    torch.testing.assert_close(full, exact, atol=1e-5, rtol=0)
    resumed = _losses(dm, ckpt_path=str(ckpt / f"epoch={SAVED}.ckpt"), **run)
    assert resumed == full[RESUMED:]  # bit for bit
