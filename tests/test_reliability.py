"""Checkpoints, resume, determinism, callbacks and odd graphs, on worlds of forked gloo ranks.

Every run here goes through ``Trainer.fit`` with ``GNNPipeStrategy`` on every rank of a world
made by :func:`tests.world.run_world` (the torchrun way: the processes exist, the strategy's
launcher does nothing), which costs about 1 s per run instead of the 15-25 s of spawning
fresh interpreters on a loaded 2-core machine.
"""

import functools
import random

import pytest
import torch
from lightning.fabric.utilities.seed import _collect_rng_states
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from torch_geometric.nn.models import GCN

from lightning_gnnpipe import GraphChunkDataModule, build_chunk_plan, find_layer_stack
from lightning_gnnpipe.nn.stack import infer_dims
from lightning_gnnpipe.data.chunk_graph import build_chunk_graph
from lightning_gnnpipe.nn.normalization import norm_keys
from lightning_gnnpipe.pipeline.stage import GNNStage
from lightning_gnnpipe.strategy.checkpoint import (CHECKPOINT_KEY, _rng_to_plain, collect_rng_states,
                                                   read_history_tables, restore_history, restore_rng,
                                                   save_history_tables, set_rng_states)
from tests.helpers import ChunkLossGCN, GCNModule, MetricRecorder, sbm_graph
from tests.reference import chunked_reference, exact_inputs, gcn_layer
from tests.scenarios import (DropoutGCN, MeanChunkLossGCN, RankDependentGCN, callback_summary, callbacks_job,
                             losses_job, rewrite_history)
from tests.world import run_world, values

RESUME_ATOL = 1e-6
"""Largest |loss difference| between a resume without history tables (exact refresh) and one with exact tables."""


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=300)


def _last_stage(results):
    return values(results)[-1]


def test_resume_bit_exact_with_history_tables(tmp_path, graph):
    """Stop after epoch 3 and resume: the loss curve equals the uninterrupted run bit for bit."""
    dm = GraphChunkDataModule(graph, num_chunks=4)
    model = functools.partial(DropoutGCN, 16, 32, 4, 4)
    ckpt = tmp_path / "ckpt"
    full = _last_stage(run_world(2, losses_job, model(), dm, 2, 6, ckpt_dir=str(ckpt),
                                 strategy_kwargs={"save_history": True}))
    # epoch=2.ckpt was written after the third epoch (epochs count from 0).
    resumed = _last_stage(run_world(2, losses_job, model(), dm, 2, 6, ckpt_path=str(ckpt / "epoch=2.ckpt"),
                                    strategy_kwargs={"save_history": True}))
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
    bare = _last_stage(run_world(2, losses_job, model(), dm, 2, 6,
                                 ckpt_path=rewrite_history(saved, tmp_path / "no_history.ckpt")))
    plain.eval()
    exact = exact_inputs([functools.partial(gcn_layer, plain.gnn, layer) for layer in range(4)], graph)
    with_exact = _last_stage(run_world(2, losses_job, model(), dm, 2, 6, ckpt_path=rewrite_history(
        saved, tmp_path / "exact_history.ckpt", {layer: exact[layer] for layer in (1, 2, 3)})))
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
    ref = chunked_reference(ChunkLossGCN(16, 32, 4, 4), graph, dm.plan, 4)
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
    ref = chunked_reference(GCNModule(16, 32, 4, 4), g, dm.plan, 4)
    got = _last_stage(run_world(2, losses_job, GCNModule(16, 32, 4, 4), dm, 2, 4))
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)


def test_stage_width_mismatch_raises_on_every_rank(graph):
    dm = GraphChunkDataModule(graph, num_chunks=2)
    results = run_world(2, losses_job, RankDependentGCN(16, 32, 4, 4), dm, 2, 1, timeout=60)
    for r in results:
        assert r.exitcode == 1 and r.seconds < 30
        assert "stage 0 sends embeddings of widths [32] but stage 1 expects widths [24]" in r.error


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
