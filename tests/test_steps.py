"""Several optimizer steps an epoch (``GraphChunkDataModule(chunks_per_step=c)``) against an independent reference.

The pipelined runs are compared with ``tests/reference.py``'s ``chunked_reference``: one process, the user's unsplit
layers on the whole graph, the same groups, the same history reads (a chunk's halo rows from the tables, written by
the chunks that ran before it, in this step or an earlier one).
"""

import pytest
import torch
from lightning.pytorch import Trainer

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, GraphParallelStrategy
from lightning_gnnpipe.data.steps import step_groups
from tests.helpers import ChunkLossGCN, GCNModule, MetricRecorder, fit, losses, sbm_graph, schedule_params
from tests.reference import chunked_reference

EPOCHS = 4


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=400)


class SGDChunkLossGCN(ChunkLossGCN):
    """Plain SGD: a wrong gradient moves the parameters by as much."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def test_step_groups_cover_every_chunk_once_per_epoch():
    fixed = step_groups(8, 2)
    assert fixed == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert step_groups(8, 8) == [list(range(8))]  # one step an epoch: today's training
    epochs = [step_groups(8, 2, "shuffle", epoch=e, seed=3) for e in range(4)]
    for groups in epochs:
        assert sorted(c for g in groups for c in g) == list(range(8))
        assert all(g == sorted(g) for g in groups)  # the plan's order inside a group
    assert len({str(g) for g in epochs}) > 1  # new groups in other epochs
    assert epochs[1] == step_groups(8, 2, "shuffle", epoch=1, seed=3)  # the same on every rank
    # hybrid: whole slots (chunk j * G + g), slot by slot
    assert step_groups(8, 4, num_parts=2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    for group in step_groups(12, 4, "shuffle", epoch=2, num_parts=2):
        assert [c // 2 for c in group] == sorted(c // 2 for c in group) and len({c // 2 for c in group}) == 2


def test_step_read_stats_with_one_step_are_the_epochs(graph):
    for parts in (1, 2):
        dm = GraphChunkDataModule(graph, num_chunks=4, num_parts=parts)
        assert dm.step_read_stats(3) == pytest.approx(dm.stale_read_stats())
    dm = GraphChunkDataModule(graph, num_chunks=4, chunks_per_step=2)  # fixed groups: the same order
    assert dm.step_read_stats(1) == pytest.approx(dm.stale_read_stats())


@pytest.mark.parametrize("kwargs,message", [
    (dict(chunks_per_step=3), "must divide `num_chunks` (8)"),
    (dict(chunks_per_step=0), "must divide"),
    (dict(chunks_per_step=2.0), "must be an int or None"),
    (dict(chunks_per_step=2, num_parts=4), "multiple of `num_parts` (4)"),
    (dict(chunks_per_step=2, chunk_groups="random"), "unknown `chunk_groups`"),
])
def test_bad_chunks_per_step_is_refused(graph, kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        GraphChunkDataModule(graph, num_chunks=8, **kwargs)


def test_several_steps_need_a_train_mask(graph):
    data = graph.clone()
    del data.train_mask
    with pytest.raises(ValueError, match="needs `data.train_mask`"):
        GraphChunkDataModule(data, num_chunks=4, chunks_per_step=2)
    GraphChunkDataModule(data, num_chunks=4)  # one step an epoch needs none


def test_single_device_takes_one_step_per_group_on_the_groups_labelled_nodes(graph):
    """Without the strategy the same DataModule trains on one device: K / c optimizer steps an epoch, each batch the
    whole graph with the train mask narrowed to its chunks' labelled nodes."""
    seen = []

    class Recording(GCNModule):
        def training_step(self, batch, batch_idx):
            seen.append((self.current_epoch, batch.chunk_ids.tolist(), batch.train_mask.clone()))
            return super().training_step(batch, batch_idx)

    dm = GraphChunkDataModule(graph, num_chunks=8, chunks_per_step=2, chunk_groups="shuffle")
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Recording(16, 32, 2, 4), datamodule=dm)
    assert trainer.global_step == 8
    for epoch in range(2):
        steps = [s for s in seen if s[0] == epoch]
        assert [s[1] for s in steps] == dm.step_groups(epoch)
        covered = torch.zeros_like(graph.train_mask)
        for _, group, mask in steps:
            inside = torch.zeros_like(mask)
            inside[torch.cat([dm.plan.nodes[c] for c in group])] = True
            assert torch.equal(mask, graph.train_mask & inside)
            covered |= mask
        assert torch.equal(covered, graph.train_mask)


@pytest.mark.parametrize("stages,schedule,groups", [(2, "gpipe", "fixed"), (2, "1f1b", "shuffle"),
                                                    (4, "1f1b", "fixed")])
def test_steps_equal_the_sequential_reference(tmp_path, graph, stages, schedule, groups):
    """K = 8 chunks, 4 a step (2 steps an epoch); the defaults otherwise (validation every epoch refreshes the tables,
    halo gradients 'auto' -> 'detach'). A read of the tables as they were when the step began (not the rows the
    chunks before in the step wrote) trains measurably differently, so the comparison can fail."""
    dm = GraphChunkDataModule(graph, num_chunks=8, chunks_per_step=4, chunk_groups=groups)
    ref = chunked_reference(ChunkLossGCN(16, 32, 4, 4), graph, dm.plan, EPOCHS, refresh_every=1, groups=dm.step_groups)
    wrong = chunked_reference(ChunkLossGCN(16, 32, 4, 4), graph, dm.plan, EPOCHS, refresh_every=1,
                              groups=dm.step_groups, wrong_read=True)
    assert max(abs(a - b) for a, b in zip(ref, wrong)) > 1e-4
    ranks = fit(str(tmp_path), ChunkLossGCN(16, 32, 4, 4), dm, devices=stages,
                strategy=GNNPipeStrategy(schedule=schedule), epochs=EPOCHS)
    torch.testing.assert_close(losses(ranks[-1]), ref, atol=1e-5, rtol=0)
    for r in ranks:
        assert losses(r) == losses(ranks[-1])
    assert ranks[0][-1]["gnnpipe/stale_edge_fraction"] == pytest.approx(dm.step_read_stats(EPOCHS - 1)[0])


@pytest.mark.parametrize("schedule", schedule_params(["interleaved_1f1b", "looped_bfs", "interleaved_zb", "zbv"]))
def test_steps_under_multi_stage_schedules_equal_the_sequential_reference(tmp_path, graph, schedule):
    """2 ranks x 2 stages each, K = 8, 4 chunks a step, no refresh (historical rows), plain SGD (lr 0.5): every epoch's
    loss and the parameters after 8 steps equal the reference's within 1e-5."""
    from tests.test_exactness import SaveWeights, _trained

    dm = GraphChunkDataModule(graph, num_chunks=8, chunks_per_step=4)
    reference = SGDChunkLossGCN(16, 32, 4, 4, lr=0.5)
    ref = chunked_reference(reference, graph, dm.plan, EPOCHS, groups=dm.step_groups)
    ranks = fit(str(tmp_path), SGDChunkLossGCN(16, 32, 4, 4, lr=0.5), dm, devices=2,
                strategy=GNNPipeStrategy(schedule=schedule, stages_per_rank=2, refresh_every=0), epochs=EPOCHS,
                callbacks=[MetricRecorder(str(tmp_path)), SaveWeights(tmp_path / "p.ckpt")])
    torch.testing.assert_close(losses(ranks[0]), ref, atol=1e-5, rtol=0)
    trained = _trained(tmp_path / "p.ckpt")
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(trained[name], value, atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_steps_sgd_parameters_equal_the_reference(tmp_path, graph, schedule):
    """Parameters after 4 epochs of 4 plain SGD steps each (lr 0.5) equal the reference's within 1e-5."""
    from tests.test_exactness import SaveWeights, _trained

    dm = GraphChunkDataModule(graph, num_chunks=8, chunks_per_step=2, chunk_groups="shuffle")
    start = SGDChunkLossGCN(16, 32, 4, 4, lr=0.5).state_dict()
    reference = SGDChunkLossGCN(16, 32, 4, 4, lr=0.5)
    chunked_reference(reference, graph, dm.plan, EPOCHS, refresh_every=1, groups=dm.step_groups)
    fit(str(tmp_path), SGDChunkLossGCN(16, 32, 4, 4, lr=0.5), dm, devices=2,
        strategy=GNNPipeStrategy(schedule=schedule), epochs=EPOCHS,
        callbacks=[MetricRecorder(str(tmp_path)), SaveWeights(tmp_path / "p.ckpt")])
    trained = _trained(tmp_path / "p.ckpt")
    for name, value in reference.state_dict().items():
        assert float((value - start[name]).abs().max()) > 1e-3, f"{name} did not train in the reference"
        torch.testing.assert_close(trained[name], value, atol=1e-5, rtol=0, msg=name)


def test_hybrid_steps_equal_the_sequential_reference(tmp_path, graph):
    """2 stages x 2 partitions, K = 8 (4 slots), 4 chunks (2 slots) a step, shuffled."""
    dm = GraphChunkDataModule(graph, num_chunks=8, num_parts=2, chunks_per_step=4, chunk_groups="shuffle")
    ref = chunked_reference(ChunkLossGCN(16, 32, 4, 4), graph, dm.plan, EPOCHS, num_parts=2, refresh_every=1,
                            groups=dm.step_groups)
    ranks = fit(str(tmp_path), ChunkLossGCN(16, 32, 4, 4), dm, devices=4,
                strategy=GNNPipeStrategy(graph_parallel_size=2), epochs=EPOCHS)
    torch.testing.assert_close(losses(ranks[0]), ref, atol=1e-5, rtol=0)


def test_a_validation_in_the_middle_of_an_epoch_is_not_a_refresh(tmp_path, graph):
    """``val_check_interval=0.5``: a validation after each of the 2 steps; only the one at the epoch's end refreshes
    the tables (training equals the reference that refreshes at every epoch's start)."""
    dm = GraphChunkDataModule(graph, num_chunks=8, chunks_per_step=4)
    ref = chunked_reference(GCNModule(16, 32, 4, 4), graph, dm.plan, EPOCHS, refresh_every=1, groups=dm.step_groups)
    ranks = fit(str(tmp_path), GCNModule(16, 32, 4, 4), dm, devices=2, strategy=GNNPipeStrategy(), epochs=EPOCHS,
                val_check_interval=0.5)
    torch.testing.assert_close(losses(ranks[1]), ref, atol=1e-5, rtol=0)


def test_what_several_steps_cannot_do_is_refused_before_any_process_starts(graph):
    dm = GraphChunkDataModule(graph, num_chunks=4, chunks_per_step=2)
    kwargs = dict(accelerator="cpu", devices=2, max_epochs=1, logger=False, enable_checkpointing=False)
    with pytest.raises(ValueError, match="`halo_gradients='fresh'` needs one training step an epoch"):
        Trainer(strategy=GNNPipeStrategy(halo_gradients="fresh"), **kwargs).fit(GCNModule(16, 32, 4, 4), dm)
    with pytest.raises(ValueError, match="GraphParallelStrategy: every training step is an exact full-graph step"):
        Trainer(strategy=GraphParallelStrategy(), **kwargs).fit(
            GCNModule(16, 32, 4, 4), GraphChunkDataModule(graph, num_chunks=2, chunks_per_step=1))
    with pytest.raises(ValueError, match="one step's chunks: chunks_per_step=2"):
        Trainer(strategy=GNNPipeStrategy(schedule="1f1b"), **{**kwargs, "devices": 4}).fit(
            ChunkLossGCN(16, 32, 4, 4), GraphChunkDataModule(graph, num_chunks=8, chunks_per_step=2))


class ReadsEveryRow(GCNModule):
    """A loss with a term over every node's output: on one device it trains through rows no step of some chunks
    computes."""

    def training_step(self, batch, batch_idx):
        out = self(batch.x, batch.edge_index)
        return torch.nn.functional.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask]) \
            + 1e-3 * out.pow(2).mean()


def test_a_loss_that_reads_rows_outside_the_step_is_refused(tmp_path, graph):
    dm = GraphChunkDataModule(graph, num_chunks=4, chunks_per_step=2)
    with pytest.raises(AssertionError, match=r"ValueError: GNNPipeStrategy: with chunks_per_step=2 < num_chunks=4 a "
                                             r"step's loss may read only the rows of its chunks .* reaches \d+ rows"):
        fit(str(tmp_path / "steps"), ReadsEveryRow(16, 32, 4, 4), dm, devices=2, strategy=GNNPipeStrategy(),
            epochs=1)
    fit(str(tmp_path / "one"), ReadsEveryRow(16, 32, 4, 4), GraphChunkDataModule(graph, num_chunks=4), devices=2,
        strategy=GNNPipeStrategy(), epochs=1)  # one step an epoch: every row is the step's
