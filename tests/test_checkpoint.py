"""Checkpoints and resume: what a checkpoint holds, and that a resumed run continues as the uninterrupted one.

Every fit here runs on a world of forked gloo ranks (:func:`tests.world.run_world`, the torchrun way: about 1 s per run
instead of the 15-25 s of spawning fresh interpreters on a loaded 2-core machine), except the resume through
Lightning's own spawn launcher (:func:`test_resume_restores_optimizer_state`). Each layout resumes from a checkpoint
and must continue bit for bit: GPipe, 1F1B and ZBV (two stages per rank) with their history tables, graph parallelism,
hybrid parallelism, and a resume into another number of stages. A pipeline checkpoint stripped of its history tables
must resume as the reference that refills the tables exactly at the resume epoch, which is measurably not the
uninterrupted curve: so the tests tell whether the refresh on resume ran.
"""

import functools
import random
import warnings

import pytest
import torch
from lightning.fabric.utilities.seed import _collect_rng_states
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch_geometric.nn.models import GCN

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, GraphParallelStrategy, build_chunk_plan, \
    find_layer_stack
from lightning_gnnpipe.data.chunk_graph import build_chunk_graph
from lightning_gnnpipe.nn.gcn_norm import norm_keys
from lightning_gnnpipe.nn.stack import infer_dims
from lightning_gnnpipe.pipeline.stage import GNNStage
from lightning_gnnpipe.strategy.checkpoint import (CHECKPOINT_KEY, _rng_to_plain, collect_rng_states,
                                                   read_history_tables, restore_history, restore_rng,
                                                   save_history_tables, set_rng_states, tables_to_save)
from tests.helpers import (ChunkLossGCN, GCNModule, MetricRecorder, fit, losses, read_metrics, sbm_graph,
                           schedule_params)
from tests.reference import chunked_reference, exact_inputs, gcn_layer, layer_major_reference
from tests.scenarios import DropoutGCN, losses_job, rewrite_history, warnings_job
from tests.world import run_world, values

RESUME_ATOL = 1e-6
"""Largest |loss difference| between a resume without history tables (exact refresh) and one with exact tables."""
EPOCHS = 5
SAVED = 1  # epoch=1.ckpt is written after the second epoch ...
RESUMED = SAVED + 1  # ... and the resumed run trains epochs 2, 3, 4
TIGHT = 1e-6  # |loss difference| allowed between a run and its single-process reference
HISTORICAL = {"refresh_every": 0}  # halo rows from the tables as the last epoch left them: what a resume must restore
PIPELINES = {"1f1b": {"schedule": "1f1b", **HISTORICAL}, "zbv": {"schedule": "zbv", "stages_per_rank": 2, **HISTORICAL}}


def _last_stage(results):
    return values(results)[-1]


def _trainer(tmp_path, epochs, **kwargs):
    base = dict(accelerator="cpu", devices=2, strategy=GNNPipeStrategy(), max_epochs=epochs,
                enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    base.update(kwargs)
    return Trainer(**base)


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


def test_resume_bit_exact_with_history_tables(tmp_path, graph):
    """Stop after epoch 3 and resume: the loss curve equals the uninterrupted run bit for bit."""
    dm = GraphChunkDataModule(graph, num_chunks=4)
    model = functools.partial(DropoutGCN, 16, 32, 4, 4)
    ckpt = tmp_path / "ckpt"
    full = _last_stage(run_world(2, losses_job, model(), dm, 2, 6, ckpt_dir=str(ckpt),
                                 strategy_kwargs={"save_history": True, **HISTORICAL}))
    # epoch=2.ckpt was written after the third epoch (epochs count from 0).
    resumed = _last_stage(run_world(2, losses_job, model(), dm, 2, 6, ckpt_path=str(ckpt / "epoch=2.ckpt"),
                                    strategy_kwargs={"save_history": True, **HISTORICAL}))
    assert len(full) == 6 and len(resumed) == 3
    assert resumed == full[3:]  # bit for bit

    state = torch.load(ckpt / "epoch=2.ckpt", weights_only=True)  # plain tensors and numbers only
    plain = model()
    plain.load_state_dict(state["state_dict"], strict=True)  # every stage, original names
    assert sorted(state["optimizer_states"][0]["state"]) == list(range(len(list(plain.parameters()))))
    assert state["lr_schedulers"][0]["last_epoch"] == 3
    extra = state[CHECKPOINT_KEY]
    assert extra["fingerprint"] == dm.plan.fingerprint() and extra["layers"] == [[0, 1], [2, 3]]
    assert len(extra["rng_states"]) == 2
    assert not torch.equal(extra["rng_states"][0]["torch"], extra["rng_states"][1]["torch"])  # dropout drew
    # every rank wrote its own tables beside the file: rank 0 layer 1, rank 1 layers 2 and 3 (boundary rows only)
    assert sorted(p.name for p in (ckpt / "epoch=2.ckpt.history").iterdir()) == [".metadata", "__0_0.distcp",
                                                                                 "__1_0.distcp"]
    rows = torch.cat(dm.plan.halo).unique().numel()
    assert {k: tuple(v.shape) for k, v in read_history_tables(ckpt / "epoch=2.ckpt").items()} == {
        f"partition0/layer{layer}": (rows, 32) for layer in (1, 2, 3)}

    # Without the tables the resume refills them exactly (no dropout, the saved weights): it continues as the
    # resume from a checkpoint holding the exact tables, computed here by the unsplit model (tests/reference.py).
    saved = str(ckpt / "epoch=2.ckpt")
    bare = _last_stage(run_world(2, losses_job, model(), dm, 2, 6, strategy_kwargs=HISTORICAL,
                                 ckpt_path=rewrite_history(saved, tmp_path / "no_history.ckpt")))
    plain.eval()
    exact = exact_inputs([functools.partial(gcn_layer, plain.gnn, layer) for layer in range(4)], graph)
    with_exact = _last_stage(run_world(2, losses_job, model(), dm, 2, 6, strategy_kwargs=HISTORICAL,
                                       ckpt_path=rewrite_history(saved, tmp_path / "exact_history.ckpt",
                                                                 {layer: exact[layer] for layer in (1, 2, 3)})))
    effect = max(abs(a - b) for a, b in zip(with_exact, full[3:]))
    print(f"resume without history tables: max |loss - resume with exact tables| = "
          f"{max(abs(a - b) for a, b in zip(bare, with_exact)):.2e}; exact vs saved tables: {effect:.2e}")
    assert effect > RESUME_ATOL * 100  # the refresh is visible in the losses
    torch.testing.assert_close(bare, with_exact, atol=RESUME_ATOL, rtol=0)


def test_resume_into_another_layout_and_evaluate_on_one_device(tmp_path, graph):
    """Train with 4 stages, resume with 2, evaluate the result on a single device."""
    dm = GraphChunkDataModule(graph, num_chunks=4)
    four = _last_stage(run_world(4, losses_job, GCNModule(16, 32, 4, 4), dm, 4, 4, ckpt_dir=str(tmp_path / "s4"),
                                 strategy_kwargs={"save_history": True}))
    two = _last_stage(run_world(2, losses_job, GCNModule(16, 32, 4, 4), dm, 2, 4,
                                ckpt_path=str(tmp_path / "s4" / "epoch=1.ckpt"), ckpt_dir=str(tmp_path / "s2"),
                                strategy_kwargs={"save_history": True}))
    # Weights, optimizer state and history tables move to the new layout: same curve.
    torch.testing.assert_close(two, four[2:], atol=1e-6, rtol=0)
    final = torch.load(tmp_path / "s2" / "epoch=3.ckpt", weights_only=True)
    assert all(int(s["step"]) == 4 for s in final["optimizer_states"][0]["state"].values())

    module = GCNModule(16, 32, 4, 4)
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False)
    test_acc = trainer.test(module, datamodule=dm, ckpt_path=str(tmp_path / "s2" / "epoch=3.ckpt"),
                            verbose=False)[0]["test_acc"]
    plain = GCNModule(16, 32, 4, 4).eval()
    plain.load_state_dict(final["state_dict"], strict=True)
    with torch.no_grad():
        pred = plain(graph.x, graph.edge_index).argmax(-1)
    assert test_acc == pytest.approx(float((pred[graph.test_mask] == graph.y[graph.test_mask]).float().mean()))


def _stage_with_layers_1_2():
    data = sbm_graph(num_nodes=60)
    torch.manual_seed(0)
    stack = find_layer_stack(GCN(16, 8, 3, 4))
    plan = build_chunk_plan(data.edge_index, 60, 2)
    dims = infer_dims(stack.blocks, data.x[:2])
    blocks = [stack.blocks[1], stack.blocks[2]]
    graph = build_chunk_graph(plan, data.edge_index, norm_keys(blocks), torch.device("cpu"))
    return GNNStage(blocks, [1, 2], dims, graph), plan


def test_restore_history_loads_refuses_or_skips():
    stage, plan = _stage_with_layers_1_2()
    ids = stage.histories["2"].node_ids  # the boundary nodes' rows
    assert ids is not None and ids.numel() < 60
    rows = ids.numel()
    saved = {"fingerprint": plan.fingerprint(), "history": {1: torch.ones(rows, 8), 2: torch.full((rows, 8), 2.0)}}
    assert restore_history(saved, stage, plan)
    assert torch.equal(stage.histories["2"].emb, torch.full((rows, 8), 2.0))
    every_node = torch.arange(60.0).repeat(8, 1).t()  # a table of all 60 nodes (an older checkpoint): its rows
    assert restore_history({**saved, "history": {1: every_node, 2: every_node}}, stage, plan)
    assert torch.equal(stage.histories["2"].emb, every_node[ids])
    with pytest.raises(ValueError, match=rf"history table of layer 2 does not fit the model \(got \({rows}, 5\), "
                                         rf"expected \({rows}, 8\)\)"):
        restore_history({**saved, "history": {1: torch.ones(rows, 8), 2: torch.ones(rows, 5)}}, stage, plan)
    with pytest.warns(UserWarning, match="belong to another chunk plan"):
        assert not restore_history({**saved, "fingerprint": "0123"}, stage, plan)
    assert not restore_history({**saved, "history": None}, stage, plan) and not restore_history(None, stage, plan)


def test_history_tables_written_beside_the_checkpoint_and_read_back(tmp_path):
    """``torch.distributed.checkpoint`` in one process: the stage's tables round-trip by key; a missing directory
    or a table of another width is refused as the inline tables are."""
    stage, plan = _stage_with_layers_1_2()
    for table in stage.histories.values():
        table.emb.normal_()
    directory = tmp_path / "epoch=0.ckpt.history"
    shapes = save_history_tables([stage], str(directory), partition=1)
    rows = stage.histories["1"].emb.size(0)  # the boundary nodes'
    assert shapes == {"partition1/layer1": (rows, 8), "partition1/layer2": (rows, 8)}
    fresh, _ = _stage_with_layers_1_2()
    saved = {"fingerprint": plan.fingerprint(), "history": None, "history_tables": {"dir": str(directory),
                                                                                   "shapes": shapes}}
    assert restore_history(saved, fresh, plan, partition=1)
    for key, table in stage.histories.items():
        assert torch.equal(fresh.histories[key].emb, table.emb)
    with pytest.raises(ValueError, match=r"history table of layer 1 does not fit the model \(got None"):
        restore_history(saved, fresh, plan, partition=0)  # pipeline 0 wrote no tables here
    with pytest.warns(UserWarning, match="history tables are missing"):
        assert not restore_history({**saved, "history_tables": {"dir": str(tmp_path / "gone"), "shapes": shapes}},
                                   fresh, plan, partition=1)


def test_rng_states_hold_no_other_device():
    """Without a CUDA device no CUDA state is saved; an old checkpoint's list of every GPU's states is ignored on
    the CPU (it was read with ``torch.cuda.get_rng_state_all``, one entry per visible GPU)."""
    states = collect_rng_states(torch.device("cpu"))
    assert "torch.cuda" not in states and set(states) == {"torch", "python", "numpy"}
    expected = torch.rand(2)
    set_rng_states({**states, "torch.cuda": [torch.zeros(16, dtype=torch.uint8)] * 2}, torch.device("cpu"))
    assert torch.equal(torch.rand(2), expected)


def test_restore_rng_same_layout_only():
    state = _rng_to_plain(_collect_rng_states())
    expected = (torch.rand(3), random.random())
    with pytest.warns(UserWarning, match="written with 4 stages, this run has 2"):
        assert not restore_rng({"num_stages": 4, "layers": [[0], [1], [2], [3]], "rng_states": [state] * 4}, 0, 2)
    assert restore_rng({"num_stages": 2, "rng_states": [None, state]}, 1, 2)
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def _losses(dm, module_cls=ChunkLossGCN, **kwargs):
    """Per-epoch training losses of a 2-process fit (every rank logs the same broadcast loss)."""
    out = values(run_world(2, losses_job, module_cls(16, 32, 4, 4), dm, 2, EPOCHS, **kwargs))
    assert out[0] == out[1]
    return out[0]


@pytest.mark.parametrize("name", schedule_params(PIPELINES))
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


def test_resume_with_the_defaults_equals_the_uninterrupted_run(tmp_path, graph):
    """The defaults with validation every epoch: each validation refreshes the tables, the halo rows' gradients reach
    their owners (``"fresh"``) and odd epochs run the chunks in reverse. A run resumed after epoch 1 (an odd one),
    with or without the saved tables, continues like the uninterrupted run, which equals the layer-major reference."""
    dm = GraphChunkDataModule(graph, num_chunks=4)
    ckpt = tmp_path / "ckpt"
    full = _losses(dm, ckpt_dir=str(ckpt), strategy_kwargs={"save_history": True})
    ref = layer_major_reference(ChunkLossGCN(16, 32, 4, 4), graph, dm.plan, EPOCHS, refresh_every=1,
                                halo_gradients="fresh")
    torch.testing.assert_close(full, ref, atol=TIGHT, rtol=0)
    saved = str(ckpt / f"epoch={SAVED}.ckpt")
    resumed = _losses(dm, ckpt_path=saved, strategy_kwargs={"save_history": True})
    assert resumed == full[RESUMED:]  # bit for bit
    bare = _losses(dm, ckpt_path=rewrite_history(saved, tmp_path / "bare.ckpt"))  # refilled with the saved weights
    torch.testing.assert_close(bare, full[RESUMED:], atol=TIGHT, rtol=0)


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


def test_hybrid_resume_equals_the_uninterrupted_run(tmp_path):
    """2 stages x 2 partitions with dropout: a run resumed after epoch 2 from a checkpoint with every pipeline's
    history tables and every rank's generators continues bit for bit like the uninterrupted run."""
    graph = sbm_graph(num_nodes=400)
    dm = GraphChunkDataModule(graph, num_chunks=8, num_parts=2)
    model = functools.partial(DropoutGCN, 16, 32, 4, 4)
    opts = {"save_history": True, "graph_parallel_size": 2}
    ckpt = tmp_path / "ckpt"
    full = values(run_world(4, losses_job, model(), dm, 4, 5, ckpt_dir=str(ckpt), strategy_kwargs=opts))[0]
    resumed = values(run_world(4, losses_job, model(), dm, 4, 5, ckpt_path=str(ckpt / "epoch=1.ckpt"),
                               strategy_kwargs=opts))[0]
    assert len(full) == 5 and resumed == full[2:]  # bit for bit
    state = torch.load(ckpt / "epoch=1.ckpt", weights_only=True)[CHECKPOINT_KEY]
    assert len(state["rng_states"]) == 4 and state["graph_parallel_size"] == 2
    tables = read_history_tables(ckpt / "epoch=1.ckpt")  # every rank wrote its own
    assert sorted(tables) == [f"partition{g}/layer{layer}" for g in (0, 1) for layer in (1, 2, 3)]
    assert not torch.equal(tables["partition0/layer1"], tables["partition1/layer1"])  # each pipeline: its own view


def test_resume_restores_optimizer_state(tmp_path, graph):
    # K = 1 has no staleness, so a resumed run must continue exactly like an uninterrupted one.
    dm = GraphChunkDataModule(graph, num_chunks=1)
    full = fit(str(tmp_path / "full"), GCNModule(16, 32, 4, 4), dm, strategy=GNNPipeStrategy(), epochs=5)[0]
    first = _trainer(tmp_path, 3, logger=False, callbacks=[ModelCheckpoint(dirpath=str(tmp_path / "c"),
                                                                           save_last=True)],
                     limit_val_batches=0)
    first.fit(GCNModule(16, 32, 4, 4), datamodule=dm)
    second = _trainer(tmp_path, 5, logger=False, callbacks=[MetricRecorder(str(tmp_path / "resumed")),
                                                            ModelCheckpoint(dirpath=str(tmp_path / "c2"),
                                                                            save_last=True)],
                      limit_val_batches=0)
    second.fit(GCNModule(16, 32, 4, 4), datamodule=dm, ckpt_path=str(tmp_path / "c" / "last.ckpt"))
    resumed = read_metrics(str(tmp_path / "resumed"))
    torch.testing.assert_close(losses(resumed), losses(full)[3:], atol=1e-6, rtol=0)
    state = torch.load(str(tmp_path / "c2" / "last.ckpt"), weights_only=False)
    assert all(int(s["step"]) == 5 for s in state["optimizer_states"][0]["state"].values())
