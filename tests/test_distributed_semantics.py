"""Lightning's distributed semantics under the strategies: what a rank logs, gathers and syncs is what one device
would log.

Every rank runs the user's unchanged steps on the whole graph's output, so the strategies present a world of one
data-parallel replica to Lightning: ``distributed_sampler_kwargs`` give every rank the whole graph,
``self.log(..., sync_dist=True)`` and ``self.all_gather`` return the single-device values, and torchmetrics states are
synced over this rank alone (a world-wide sync would count every node once per rank).
"""

import pytest
import torch
from torchmetrics import MeanMetric, SumMetric
from torchmetrics.classification import MulticlassAccuracy

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, GraphParallelStrategy
from tests.helpers import GCNModule, fit, sbm_graph

EPOCHS = 2


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=300)


class CountingGCN(GCNModule):
    """Counts labelled nodes three ways (a torchmetrics ``SumMetric``, ``sync_dist`` sums, ``all_gather``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.labelled = SumMetric()
        self.mean_label = MeanMetric()
        self.val_accuracy = MulticlassAccuracy(num_classes=4, average="micro")

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        count = batch.train_mask.sum().float()
        self.labelled.update(count)
        self.mean_label.update(batch.y[batch.train_mask].float())
        self.log("labelled", self.labelled, on_epoch=True, on_step=False, batch_size=1)
        self.log("mean_label", self.mean_label, on_epoch=True, on_step=False, batch_size=1)
        self.log("labelled_sync", count, sync_dist=True, reduce_fx="sum", on_epoch=True, on_step=False, batch_size=1)
        gathered = self.all_gather(count)
        self.log("gathered_numel", float(gathered.numel()), on_epoch=True, on_step=False, batch_size=1)
        self.log("gathered_sum", gathered.sum(), on_epoch=True, on_step=False, batch_size=1)
        self.log("graphs_seen", float(batch.num_nodes), on_epoch=True, on_step=False, batch_size=1)
        return loss

    def validation_step(self, batch, batch_idx):
        out = self(batch.x, batch.edge_index)
        self.val_accuracy(out[batch.val_mask], batch.y[batch.val_mask])
        self.log("val_acc_metric", self.val_accuracy, batch_size=1)
        self.log("val_count", batch.val_mask.sum().float(), sync_dist=True, reduce_fx="sum", batch_size=1)


KEYS = ["labelled", "mean_label", "labelled_sync", "gathered_numel", "gathered_sum", "graphs_seen", "train_loss",
        "val_acc_metric", "val_count"]


@pytest.fixture(scope="module")
def one_device(graph, tmp_path_factory):
    d = str(tmp_path_factory.mktemp("one"))
    return fit(d, CountingGCN(16, 32, 4, 4), GraphChunkDataModule(graph, num_chunks=1), devices=1, epochs=EPOCHS)[0]


@pytest.mark.parametrize("mode", ["gnnpipe", "graph_parallel", "hybrid"])
def test_logged_synced_and_gathered_values_equal_one_device(tmp_path, graph, one_device, mode):
    """One chunk per pipeline (exact training), so every rank's per-epoch ``SumMetric``, ``MeanMetric``, ``MulticlassAccuracy``, ``sync_dist`` sums and
    ``all_gather`` equal one device's (the ``SumMetric`` read 2x under 2 processes when torchmetrics synced over
    the world)."""
    if mode == "gnnpipe":
        devices, strategy, dm = 2, GNNPipeStrategy(), GraphChunkDataModule(graph, num_chunks=1)
    elif mode == "graph_parallel":
        devices, strategy, dm = 2, GraphParallelStrategy(), GraphChunkDataModule(graph, num_chunks=2)
    else:
        devices, strategy = 4, GNNPipeStrategy(graph_parallel_size=2)
        dm = GraphChunkDataModule(graph, num_chunks=2, num_parts=2)
    ranks = fit(str(tmp_path), CountingGCN(16, 32, 4, 4), dm, devices=devices, strategy=strategy, epochs=EPOCHS)
    expected_count = float(graph.train_mask.sum())
    assert [m["labelled"] for m in one_device] == [expected_count] * EPOCHS  # reset every epoch
    for rank, metrics in enumerate(ranks):
        assert len(metrics) == EPOCHS
        for epoch, (got, want) in enumerate(zip(metrics, one_device)):
            for key in KEYS:
                tol = 1e-5 if key in ("train_loss", "val_acc_metric") else 0.0
                assert abs(got[key] - want[key]) <= tol, (mode, rank, epoch, key, got[key], want[key])
