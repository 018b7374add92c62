"""Checkpoints and resume: what a checkpoint holds, and that a resumed run continues as the uninterrupted one.

Every fit here runs on a world of forked gloo ranks (:func:`tests.world.run_world`, the torchrun way: about 1 s per run
instead of the 15-25 s of spawning fresh interpreters on a loaded 2-core machine).
"""

import warnings

import pytest
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_gnnpipe import GraphChunkDataModule
from lightning_gnnpipe.strategy.checkpoint import tables_to_save
from tests.helpers import GCNModule, sbm_graph
from tests.scenarios import warnings_job
from tests.world import run_world, values


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=300)


def test_save_history_on_a_weights_only_checkpoint_warns():
    with pytest.warns(UserWarning, match=r"`save_history=True`, but this checkpoint is weights-only \(no optimizer "
                                         r"states: it cannot resume training\), so its history tables are not written"):
        assert tables_to_save(True, {"state_dict": {}}) is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tables_to_save(True, {"state_dict": {}, "optimizer_states": []}) is True
        assert tables_to_save(False, {"state_dict": {}}) is False


def test_weights_only_checkpoints_of_a_fit_with_save_history(tmp_path, graph):
    """``ModelCheckpoint(save_weights_only=True)`` with ``save_history=True``: no tables beside the files, and rank 0
    says so at each save (Python's default filter shows it once)."""
    dm = GraphChunkDataModule(graph, num_chunks=2)
    keep = ModelCheckpoint(dirpath=str(tmp_path), filename="{epoch}", save_top_k=-1, save_weights_only=True)
    told = values(run_world(2, warnings_job, GCNModule(16, 16, 2, 4), dm, 2, 2, callbacks=[keep],
                            strategy_kwargs={"save_history": True}))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch=0.ckpt", "epoch=1.ckpt"]  # no .history directory
    assert sum("its history tables are not written" in w for w in told[0]) == 2  # (the job records every warning)
    assert not any("history tables" in w for w in told[1])  # rank_zero_warn
