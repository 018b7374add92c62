"""Multi-process (gloo) training against single-process references."""

import pytest
import torch
from lightning.pytorch import Callback, Trainer

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule
from tests.helpers import ChunkLossGCN, GCNModule, MetricRecorder, fit, losses, sbm_graph, schedule_params
from tests.reference import chunked_reference, layer_major_reference

EPOCHS = 5


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=400)


def test_one_chunk_two_stages_equals_single_device(tmp_path, graph):
    dm = GraphChunkDataModule(graph, num_chunks=1)
    single = fit(str(tmp_path / "s"), GCNModule(16, 32, 4, 4), dm, devices=1, epochs=EPOCHS)[0]
    # The strategy's own spawn launcher, as a user's script runs it (the other tests fork a world).
    ranks = fit(str(tmp_path / "p"), GCNModule(16, 32, 4, 4), dm, devices=2, strategy=GNNPipeStrategy(),
                epochs=EPOCHS, launcher="spawn")
    assert len(losses(single)) == EPOCHS
    torch.testing.assert_close(losses(ranks[0]), losses(single), atol=1e-5, rtol=0)
    assert losses(ranks[0]) == losses(ranks[1])  # every rank logs the last stage's loss


@pytest.mark.parametrize("stages,schedule", [(2, "gpipe"), (2, "1f1b"), (4, "gpipe"), (4, "1f1b")])
def test_four_chunks_equal_sequential_reference(tmp_path, graph, stages, schedule):
    # the defaults validate every epoch: a refresh in each validation, and fresh halo gradients
    dm = GraphChunkDataModule(graph, num_chunks=4)
    ref = layer_major_reference(ChunkLossGCN(16, 32, 4, 4), graph, dm.plan, EPOCHS, refresh_every=1,
                                halo_gradients="fresh")
    module = ChunkLossGCN(16, 32, 4, 4)
    ranks = fit(str(tmp_path), module, dm, devices=stages, strategy=GNNPipeStrategy(schedule=schedule),
                epochs=EPOCHS)
    torch.testing.assert_close(losses(ranks[-1]), ref, atol=1e-6, rtol=0)
    for r in ranks:
        assert losses(r) == losses(ranks[-1])


@pytest.mark.parametrize("schedule", schedule_params(["interleaved_1f1b", "looped_bfs", "interleaved_zb", "zbv"]))
def test_multi_stage_schedules_equal_sequential_reference(tmp_path, graph, schedule):
    # S = 2 ranks x v = 2 stages per rank: 4 one-layer stages (zbv: the last one on rank 0), K = 4; historical rows
    dm = GraphChunkDataModule(graph, num_chunks=4)
    ref = chunked_reference(ChunkLossGCN(16, 32, 4, 4), graph, dm.plan, EPOCHS)
    ranks = fit(str(tmp_path), ChunkLossGCN(16, 32, 4, 4), dm, devices=2,
                strategy=GNNPipeStrategy(schedule=schedule, stages_per_rank=2, refresh_every=0), epochs=EPOCHS)
    torch.testing.assert_close(losses(ranks[0]), ref, atol=1e-6, rtol=0)
    assert losses(ranks[1]) == losses(ranks[0])
    # Every stage's P2P is counted; zbv passes stage 1 -> 2 inside rank 1 (no transfer): K chunks of M rows x 32.
    crossings = 2 if schedule == "zbv" else 3
    for kind in ("stage_activations", "stage_gradients"):
        assert ranks[0][-1][f"comm/sent/{kind}"] == crossings * 4 * dm.plan.max_chunk_size * 32 * 4


def test_every_stage_trains(tmp_path, graph):
    dm = GraphChunkDataModule(graph, num_chunks=4)
    module = GCNModule(16, 32, 4, 4)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = Trainer(accelerator="cpu", devices=2, strategy=GNNPipeStrategy(), max_epochs=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(module, datamodule=dm)
    after = module.state_dict()  # rank 0's model, handed back to this process by spawn
    assert set(after) == set(before)
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert unchanged == [], f"parameters of some stage did not change: {unchanged}"


def test_techniques_equal_sequential_reference(tmp_path, graph):
    # Moving-average tables, PipeGCN-style stale halo gradients and a periodic exact refresh.
    dm = GraphChunkDataModule(graph, num_chunks=4)
    opts = dict(refresh_every=2, history_momentum=0.5)
    ref = chunked_reference(GCNModule(16, 32, 4, 4), graph, dm.plan, EPOCHS, refresh_every=2, momentum=0.5,
                            stale_halo_grads=True)
    plain = chunked_reference(GCNModule(16, 32, 4, 4), graph, dm.plan, EPOCHS)
    assert abs(ref[-1] - plain[-1]) > 1e-4  # the techniques change training
    ranks = fit(str(tmp_path), GCNModule(16, 32, 4, 4), dm, devices=2,
                strategy=GNNPipeStrategy(halo_gradients="stale", **opts), epochs=EPOCHS)
    torch.testing.assert_close(losses(ranks[1]), ref, atol=1e-6, rtol=0)
    assert ranks[0][-1]["gnnpipe/stale_edge_fraction"] == pytest.approx(dm.stale_read_stats()[0])
    assert 0 < ranks[0][-1]["gnnpipe/drift_layer1"] < 1


@pytest.mark.parametrize("refresh_every,trainer_kwargs,reference_every,calls", [
    (2, {}, 2, "wewewe"),  # the validations before epochs 2 and 4 write the tables
    ("auto", {}, 1, "wwwwwe"),  # the default with validation every epoch: every validation but the last
    ("auto", {"check_val_every_n_epoch": 2}, 0, "wee"),  # not every epoch: no refresh (it would cost a forward)
])
def test_validation_before_a_refresh_is_the_refresh(tmp_path, graph, monkeypatch, refresh_every, trainer_kwargs,
                                                    reference_every, calls):
    """With validation every epoch, the refresh that ``refresh_every=2`` owes epochs 2 and 4 is the validation's own
    pipelined forward (after epochs 1 and 3; not after the last), and training equals the sequential reference.
    ``"auto"`` refreshes at every validation where the fit validates every epoch, and never where it does not."""
    import torch.distributed as dist

    from lightning_gnnpipe.pipeline.runtime import PipelineRuntime

    out, original = tmp_path / "calls", PipelineRuntime.full_forward
    out.mkdir()

    def counted(self, write_history=False, drift=None):  # the forked ranks inherit it
        with open(out / str(dist.get_rank()), "a") as f:
            f.write("w" if write_history else "e")
        return original(self, write_history, drift)

    monkeypatch.setattr(PipelineRuntime, "full_forward", counted)
    dm = GraphChunkDataModule(graph, num_chunks=4)
    if reference_every == 1:  # "auto" refreshing every epoch: fresh halo gradients too
        ref = layer_major_reference(GCNModule(16, 32, 4, 4), graph, dm.plan, EPOCHS, refresh_every=1,
                                    halo_gradients="fresh")
    else:
        ref = chunked_reference(GCNModule(16, 32, 4, 4), graph, dm.plan, EPOCHS, refresh_every=reference_every)
    ranks = fit(str(tmp_path), GCNModule(16, 32, 4, 4), dm, devices=2,
                strategy=GNNPipeStrategy(refresh_every=refresh_every, evaluation="pipeline"), epochs=EPOCHS,
                **trainer_kwargs)
    torch.testing.assert_close(losses(ranks[1]), ref, atol=1e-6, rtol=0)
    assert [(out / str(r)).read_text() for r in range(2)] == [calls] * 2  # "w" first: the refresh at the start
    assert ("gnnpipe/drift_layer1" in ranks[0][-1]) == bool(reference_every)
    assert [m.get("val_acc") for m in ranks[0]] == [m.get("val_acc") for m in ranks[1]]


def test_gcnii_one_chunk_three_stages_equals_single_device(tmp_path, graph):
    from tests.helpers import GCNIIModule

    dm = GraphChunkDataModule(graph, num_chunks=1)
    single = fit(str(tmp_path / "s"), GCNIIModule(16, 32, 4, 4), dm, devices=1, epochs=EPOCHS)[0]
    ranks = fit(str(tmp_path / "p"), GCNIIModule(16, 32, 4, 4), dm, devices=3, strategy=GNNPipeStrategy(),
                epochs=EPOCHS)
    torch.testing.assert_close(losses(ranks[0]), losses(single), atol=1e-5, rtol=0)


@pytest.mark.parametrize("refresh_every", [0, 1])
def test_gcnii_stale_halo_gradients_equal_sequential_reference(tmp_path, graph, refresh_every):
    """GCNII (h0 carried through the stages) with PipeGCN-style stale halo gradients, alone and beside an exact
    refresh every epoch (then the pipelined forward is exact and only the halo gradients are one epoch late)."""
    from lightning_gnnpipe import find_layer_stack
    from tests.helpers import GCNIIModule

    dm = GraphChunkDataModule(graph, num_chunks=4)
    module = GCNIIModule(16, 32, 4, 4)
    ref = chunked_reference(module, graph, dm.plan, EPOCHS, refresh_every=refresh_every, stale_halo_grads=True,
                            layers=list(find_layer_stack(module.gnn).blocks))
    ranks = fit(str(tmp_path), GCNIIModule(16, 32, 4, 4), dm, devices=2,
                strategy=GNNPipeStrategy(halo_gradients="stale", refresh_every=refresh_every), epochs=EPOCHS)
    torch.testing.assert_close(losses(ranks[1]), ref, atol=1e-6, rtol=0)


class ShrinkWeights(Callback):
    """Scale every weight by 0.8 at each epoch's end, after its validation."""

    def on_train_epoch_end(self, trainer, pl_module):
        with torch.no_grad():
            for p in pl_module.parameters():
                p.mul_(0.8)


def test_weights_changed_after_the_validation_get_their_own_refresh(tmp_path, graph):
    """A callback changes the weights after the validation that wrote the tables: the next epoch refreshes again
    (the same training as without validation, where every refresh runs at the epoch's start)."""
    dm = GraphChunkDataModule(graph, num_chunks=4)
    run = lambda name, **kw: losses(fit(str(tmp_path / name), GCNModule(16, 32, 4, 4), dm, devices=2,  # noqa: E731
                                        strategy=GNNPipeStrategy(refresh_every=1), epochs=EPOCHS,
                                        callbacks=[MetricRecorder(str(tmp_path / name)), ShrinkWeights()], **kw)[1])
    without = run("without", limit_val_batches=0)
    torch.testing.assert_close(run("with"), without, atol=1e-6, rtol=0)


def test_refresh_every_epoch_trains_on_the_exact_forward(tmp_path, graph):
    """With ``refresh_every=1`` (one optimizer step per epoch) every halo row a chunk reads is exact, so each epoch's
    training loss is the unsplit model's full-graph loss of that epoch's weights; the weights come from the chunked
    reference, run one epoch at a time (plain SGD: no optimizer state to carry)."""
    import torch.nn.functional as F

    from lightning_gnnpipe import find_layer_stack
    from tests.helpers import GCNIIModule

    class SGDGCNII(GCNIIModule):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)

    dm, module = GraphChunkDataModule(graph, num_chunks=4), SGDGCNII(16, 32, 4, 4)
    exact = []
    for _ in range(EPOCHS):
        with torch.no_grad():
            out = module(graph.x, graph.edge_index)
        exact.append(float(F.cross_entropy(out[graph.train_mask], graph.y[graph.train_mask])))
        chunked_reference(module, graph, dm.plan, 1, layers=list(find_layer_stack(module.gnn).blocks))
    assert exact[-1] < exact[0] - 1e-3  # it trains
    ranks = fit(str(tmp_path), SGDGCNII(16, 32, 4, 4), dm, devices=2,
                strategy=GNNPipeStrategy(refresh_every=1, halo_gradients="detach"), epochs=EPOCHS)
    torch.testing.assert_close(losses(ranks[1]), exact, atol=1e-6, rtol=0)
    plain = fit(str(tmp_path / "plain"), SGDGCNII(16, 32, 4, 4), dm, devices=2,
                strategy=GNNPipeStrategy(refresh_every=0, halo_gradients="detach"), epochs=EPOCHS)
    assert abs(losses(plain[1])[-1] - exact[-1]) > 1e-5  # without the refresh the forward reads stale rows


class SGDChunkLossGCN(ChunkLossGCN):
    """Plain SGD, no momentum, no clipping: every gradient error moves the parameters by as much (Adam would
    hide a constant gradient scale)."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class SaveWeights(Callback):
    """Write the trained weights (a collective checkpoint, every stage's tensors synced) at the end of fit."""

    def __init__(self, path):
        self.path = path

    def on_fit_end(self, trainer, pl_module):
        trainer.save_checkpoint(self.path)


def _trained(path):
    return torch.load(path, weights_only=True)["state_dict"]


@pytest.mark.parametrize("schedule,devices", [("gpipe", 2), ("1f1b", 2), ("graph_parallel", 2)])
def test_sgd_parameters_equal_the_reference(tmp_path, graph, schedule, devices):
    """Parameters after 5 plain SGD steps (lr 0.5) equal an independent reference within 1e-6: the chunked
    sequential algorithm for the pipelines, single-device training for graph parallelism."""
    from lightning_gnnpipe import GraphParallelStrategy
    from tests.helpers import MetricRecorder

    start = SGDChunkLossGCN(16, 32, 4, 4, lr=0.5).state_dict()
    if schedule == "graph_parallel":
        dm = GraphChunkDataModule(graph, num_chunks=devices)
        fit(str(tmp_path / "s"), SGDChunkLossGCN(16, 32, 4, 4, lr=0.5), GraphChunkDataModule(graph, num_chunks=1),
            devices=1, epochs=EPOCHS, callbacks=[MetricRecorder(str(tmp_path / "s")), SaveWeights(tmp_path / "s.ckpt")])
        expected = _trained(tmp_path / "s.ckpt")
        strategy = GraphParallelStrategy()
    else:
        dm = GraphChunkDataModule(graph, num_chunks=4)
        reference = SGDChunkLossGCN(16, 32, 4, 4, lr=0.5)
        # the default: validation refreshes, fresh halo gradients
        layer_major_reference(reference, graph, dm.plan, EPOCHS, refresh_every=1, halo_gradients="fresh")
        expected = reference.state_dict()
        strategy = GNNPipeStrategy(schedule=schedule)
    fit(str(tmp_path / "p"), SGDChunkLossGCN(16, 32, 4, 4, lr=0.5), dm, devices=devices, strategy=strategy,
        epochs=EPOCHS, callbacks=[MetricRecorder(str(tmp_path / "p")), SaveWeights(tmp_path / "p.ckpt")])
    trained = _trained(tmp_path / "p.ckpt")
    assert set(trained) == set(expected)
    for name, value in expected.items():
        moved = float((value - start[name]).abs().max())
        assert moved > 1e-3, f"{name} did not train in the reference"  # so a wrong step is visible
        torch.testing.assert_close(trained[name], value, atol=1e-6, rtol=0, msg=name)
