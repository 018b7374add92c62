"""``schedule="auto"`` (the default): 1F1B driven by the user's unchanged ``training_step`` when its loss is
row-separable, GPipe otherwise; the probe, the choice, the silenced per-chunk calls and the exact step."""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import Callback
from torchmetrics import SumMetric

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule
from lightning_gnnpipe.pipeline.separable import probe_row_separable
from lightning_gnnpipe.strategy.quiet_step import quiet_step
from lightning_gnnpipe.strategy.schedule_choice import ScheduleChoice, choose_schedule
from tests.helpers import GCNModule, MetricRecorder, fit, losses, sbm_graph
from tests.reference import chunked_reference
from tests.test_exactness import SaveWeights, _trained

EPOCHS = 4
MODEL = (16, 32, 4, 4)
LR = 0.5


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=300)


def masked_ce(mask, y):
    return lambda out: F.cross_entropy(out[mask], y[mask])


def node_softmax_loss(mask, y):  # mixes rows: a softmax over the nodes
    return lambda out: -(out.softmax(dim=0)[mask, y[mask]]).log().mean()


def test_probe_accepts_per_node_losses_and_refuses_mixing_ones():
    n, c = 50, 3
    g = torch.Generator().manual_seed(0)
    y, mask = torch.randint(c, (n,), generator=g), torch.rand(n, generator=g) < 0.5
    chunks = [torch.arange(0, 20), torch.arange(20, 35), torch.arange(35, 50)]
    assert probe_row_separable(masked_ce(mask, y), n, c, chunks) is None
    assert probe_row_separable(lambda out: (out[mask] ** 2).sum() + out.mean(), n, c, chunks) is None
    why = probe_row_separable(node_softmax_loss(mask, y), n, c, chunks)
    assert why is not None and "chunk 0's rows changed by" in why
    why = probe_row_separable(lambda out: F.mse_loss(out, out.mean(0, keepdim=True).expand_as(out)), n, c, chunks)
    assert why is not None  # centring on the column mean couples all rows
    with pytest.raises(RuntimeError, match="does not depend on the model output"):
        probe_row_separable(lambda out: torch.tensor(1.0), n, c, chunks)


def test_choose_schedule():
    separable, mixing = (lambda: None), (lambda: "it mixes rows")
    assert choose_schedule("auto", 8, 2, False, separable) == ScheduleChoice("1f1b", "separable")
    assert choose_schedule("auto", 8, 2, True, mixing) == ScheduleChoice("1f1b", "chunk")
    assert choose_schedule("auto", 8, 2, False, mixing) == ScheduleChoice("gpipe", "deferred", "it mixes rows")
    few = choose_schedule("auto", 1, 2, True, separable)
    assert few.schedule == "gpipe" and "got 1 < 2" in few.reason
    assert choose_schedule("gpipe", 8, 2, False, mixing) == ScheduleChoice("gpipe", "deferred")
    assert choose_schedule("zbv", 8, 2, False, separable) == ScheduleChoice("zbv", "separable")

    def never():
        raise AssertionError("the probe ran although a hook was given")
    assert choose_schedule("1f1b", 8, 2, True, never) == ScheduleChoice("1f1b", "chunk")
    with pytest.raises(ValueError, match=r"schedule '1f1b' runs backwards before all chunks .* but it mixes rows\. "
                                         r"Define `pipeline_chunk_loss"):
        choose_schedule("1f1b", 8, 2, False, mixing)


class CountingGCN(GCNModule):
    """An ordinary module whose ``training_step`` also logs and updates a torchmetrics metric."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = SumMetric()

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.calls(torch.tensor(1.0))
        self.log("steps_seen", self.calls, on_epoch=True, on_step=False, batch_size=1)
        return loss


def test_quiet_step_silences_and_restores():
    module = CountingGCN(*MODEL)
    own_log = lambda *a, **k: None  # noqa: E731  a log the user set on the instance survives
    module.log = own_log
    with quiet_step(module):
        assert module.calls(torch.tensor(5.0)).item() == 0.0
        module.calls.update(torch.tensor(5.0))
        module.log_dict({"a": 1.0})
    assert module.log is own_log and "log_dict" not in module.__dict__
    assert "forward" not in module.calls.__dict__
    assert float(module.calls.compute()) == 0.0  # nothing was added
    module.calls(torch.tensor(2.0))
    assert float(module.calls.compute()) == 2.0


class SGDGCN(GCNModule):
    """An ordinary module (no `pipeline_chunk_loss`) trained with plain SGD."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class SGDCountingGCN(CountingGCN):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class NodeSoftmaxGCN(SGDGCN):
    """A loss that mixes the nodes' outputs: 1F1B cannot drive it."""

    def training_step(self, batch, batch_idx):
        out = self(batch.x, batch.edge_index)
        loss = node_softmax_loss(batch.train_mask, batch.y)(out)
        self.log("train_loss", loss, batch_size=1, on_epoch=True, on_step=False)
        return loss


class RecordChoice(Callback):
    def __init__(self, directory):
        self.directory = Path(directory)

    def on_train_end(self, trainer, pl_module):
        choice = trainer.strategy.schedule_choice
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / f"choice.rank{trainer.global_rank}.json").write_text(json.dumps(list(choice)))


def _choices(directory, ranks):
    return [json.loads((Path(directory) / f"choice.rank{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.parametrize("devices,G", [(2, 1), (4, 1), (4, 2)])
def test_default_runs_1f1b_with_an_ordinary_module_and_takes_the_reference_step(tmp_path, graph, devices, G):
    """``GNNPipeStrategy()`` with a plain ``training_step`` (no hook): 1F1B, loss mode "separable". Parameters after
    4 plain-SGD steps equal the chunked reference's within 1e-6 (2 and 4 stages; hybrid 2 x 2), the logged loss is the
    reference's, and the step's logging and metrics ran once per step, not once per chunk."""
    dm = GraphChunkDataModule(graph, num_chunks=4 * G, num_parts=G)
    reference = SGDGCN(*MODEL, lr=LR)
    start = {k: v.clone() for k, v in reference.state_dict().items()}
    ref_losses = chunked_reference(reference, graph, dm.plan, EPOCHS, num_parts=G)
    expected = reference.state_dict()
    ranks = fit(str(tmp_path), SGDCountingGCN(*MODEL, lr=LR), dm, devices=devices,
                strategy=GNNPipeStrategy(graph_parallel_size=G), epochs=EPOCHS, limit_val_batches=0,
                callbacks=[MetricRecorder(str(tmp_path)), SaveWeights(tmp_path / "w.ckpt"), RecordChoice(tmp_path)])
    assert _choices(tmp_path, devices) == [["1f1b", "separable", None]] * devices
    trained = _trained(tmp_path / "w.ckpt")
    for name, value in expected.items():
        assert float((value - start[name]).abs().max()) > 1e-3, f"{name} did not train in the reference"
        torch.testing.assert_close(trained[name], value, atol=1e-6, rtol=0, msg=name)
    torch.testing.assert_close(losses(ranks[-1]), ref_losses, atol=1e-6, rtol=0)
    # Lightning resets a logged metric each epoch: 1.0 per epoch is one update per step (not one per chunk, K + 1)
    assert [m["steps_seen"] for m in ranks[0]] == [1.0] * EPOCHS


def test_default_keeps_gpipe_for_a_mixing_loss_and_a_named_1f1b_refuses_it(tmp_path, graph):
    dm = GraphChunkDataModule(graph, num_chunks=4)
    fit(str(tmp_path / "auto"), NodeSoftmaxGCN(*MODEL, lr=LR), dm, devices=2, strategy=GNNPipeStrategy(),
        epochs=1, limit_val_batches=0, callbacks=[MetricRecorder(str(tmp_path / "auto")), RecordChoice(tmp_path)])
    (schedule, mode, reason), _ = _choices(tmp_path, 2)
    assert (schedule, mode) == ("gpipe", "deferred") and "mixes nodes' outputs" in reason
    with pytest.raises(Exception, match=r"schedule '1f1b' runs backwards before all chunks have run forward"):
        fit(str(tmp_path / "named"), NodeSoftmaxGCN(*MODEL, lr=LR), dm, devices=2,
            strategy=GNNPipeStrategy(schedule="1f1b"), epochs=1, limit_val_batches=0)
