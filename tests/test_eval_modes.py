"""Evaluation in every mode, and a world of two nodes, on forked gloo ranks (the torchrun way).

* ``trainer.validate(ckpt_path=...)`` and ``trainer.predict`` with a ``BasePredictionWriter`` (ranks started
  outside Lightning cannot hand predictions back, so the writer saves each rank's to a file) under
  ``GNNPipeStrategy`` (2 stages), ``GraphParallelStrategy`` (2 partitions) and hybrid parallelism (2 stages x 2
  partitions): equal to the plain LightningModule with the checkpoint's weights on the full graph.
* ``Trainer(num_nodes=2, devices=1)``: one process per node, with torchrun's per-node environment.
* Validation inside a fit under ``GNNPipeStrategy``'s two exact forwards (``evaluation="graph_parallel"``, the
  default, and ``"pipeline"``): the same metrics every epoch, for GCN (2 and 3 stages), GCNII, GAT and ResGCN.
"""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from torch import nn
from torch_geometric.nn import GATConv, GCNConv
from torch_geometric.nn.models import GAT, GCN

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, GraphParallelStrategy, find_layer_stack
from lightning_gnnpipe.data.chunk import ChunkPlan
from lightning_gnnpipe.nn.gcnii import GCNII
from lightning_gnnpipe.nn.stack import BlockStack, NodeWise
from lightning_gnnpipe.strategy.checks import resolve_evaluation
from lightning_gnnpipe.strategy.graph_parallel_eval import AUTO_MAX_BYTES_RATIO, exchange_bytes_ratio
from tests.helpers import GCNModule, GNNModule, ResGCN, sbm_graph
from tests.reference import chunked_reference
from tests.scenarios import fit_rank
from tests.world import run_world, values

MODES = {  # processes, strategy, its options, the DataModule's options
    "gnnpipe": (2, GNNPipeStrategy, {"evaluation": "graph_parallel"}, {"num_chunks": 4}),
    "gnnpipe_pipelined_eval": (2, GNNPipeStrategy, {"evaluation": "pipeline"}, {"num_chunks": 4}),
    "graph_parallel": (2, GraphParallelStrategy, {}, {"num_chunks": 2}),
    "hybrid": (4, GNNPipeStrategy, {"graph_parallel_size": 2}, {"num_chunks": 4, "num_parts": 2}),
}
CHECKPOINT = "epoch=0.ckpt"  # written after the first of two epochs: neither the initial nor the final weights


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=300)


def val_metrics(out, batch):
    """Validation loss (continuous) and accuracy of the logits ``out`` ``(|V|, C)``."""
    mask = batch.val_mask
    return {"val_loss": F.cross_entropy(out[mask], batch.y[mask]),
            "val_acc": (out[mask].argmax(-1) == batch.y[mask]).float().mean()}


class EvalGCN(GCNModule):
    """``GCNModule`` logging a validation loss too, and predicting the logits."""

    def validation_step(self, batch, batch_idx):
        for name, value in val_metrics(self(batch.x, batch.edge_index), batch).items():
            self.log(name, value, batch_size=1)

    def predict_step(self, batch, batch_idx):
        return self(batch.x, batch.edge_index)


class LogitsWriter(BasePredictionWriter):
    """Save each rank's prediction to ``<directory>/logits.rank<r>.pt``."""

    def __init__(self, directory: str) -> None:
        super().__init__(write_interval="batch")
        self.directory = directory

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        torch.save(prediction.cpu(), Path(self.directory) / f"logits.rank{trainer.global_rank}.pt")


def eval_job(dm, devices, strategy_cls, opts, directory):
    """Fit 2 epochs (checkpoint each), then validate and predict fresh modules from the first checkpoint."""
    trainer = fit_rank(EvalGCN(16, 32, 4, 4), dm, devices, 2, strategy_cls=strategy_cls, strategy_kwargs=opts,
                       ckpt_dir=str(Path(directory) / "ckpt"), callbacks=[LogitsWriter(directory)])["trainer"]
    path = str(Path(directory) / "ckpt" / CHECKPOINT)
    metrics = trainer.validate(EvalGCN(16, 32, 4, 4), datamodule=dm, ckpt_path=path, verbose=False)[0]
    trainer.predict(EvalGCN(16, 32, 4, 4), datamodule=dm, ckpt_path=path, return_predictions=False)
    return metrics


def _plain(graph, state_dict=None):
    """Logits and validation metrics of the plain module on one device (initial weights, or ``state_dict``'s)."""
    module = EvalGCN(16, 32, 4, 4)
    if state_dict is not None:
        module.load_state_dict(state_dict, strict=True)
    module.eval()
    with torch.no_grad():
        out = module(graph.x, graph.edge_index)
    return out, {k: float(v) for k, v in val_metrics(out, graph).items()}


@pytest.mark.parametrize("mode", MODES)
def test_validate_and_predict_equal_the_plain_module(tmp_path, graph, mode):
    devices, strategy_cls, opts, dm_opts = MODES[mode]
    dm = GraphChunkDataModule(graph, **dm_opts)
    metrics = values(run_world(devices, eval_job, dm, devices, strategy_cls, opts, str(tmp_path)))
    state = torch.load(tmp_path / "ckpt" / CHECKPOINT, weights_only=True)
    out, expected = _plain(graph, state["state_dict"])
    initial = _plain(graph)[1]
    assert abs(initial["val_loss"] - expected["val_loss"]) > 1e-3  # the checkpoint's weights must be loaded
    predictions = [torch.load(tmp_path / f"logits.rank{rank}.pt") for rank in range(devices)]
    print(f"{mode}: max |metric difference| {max(abs(m[k] - v) for m in metrics for k, v in expected.items()):.2e}, "
          f"max |logit difference| {max(float((p - out).abs().max()) for p in predictions):.2e}")
    for got, logits in zip(metrics, predictions):
        assert set(got) == set(expected)
        assert all(abs(got[name] - value) <= 1e-6 for name, value in expected.items()), (got, expected)
        torch.testing.assert_close(logits, out, atol=1e-5, rtol=0)


def node_job(dm, devices, epochs, **trainer_kwargs):
    """Fit; return the losses and where Lightning and the strategy placed this rank."""
    out = fit_rank(GCNModule(16, 32, 4, 4), dm, devices, epochs, limit_val_batches=0, **trainer_kwargs)
    trainer = out["trainer"]
    return {"losses": out["losses"], "place": (trainer.node_rank, trainer.local_rank, trainer.global_rank,
                                               trainer.world_size, trainer.strategy.rank_location()),
            "environment": type(trainer.strategy.cluster_environment).__name__}


def test_two_nodes_one_process_each(graph):
    """``Trainer(num_nodes=2, devices=1)`` under torchrun's environment trains as 2 processes on one node."""
    dm = GraphChunkDataModule(graph, num_chunks=4)
    epochs = 4
    nodes = values(run_world(2, node_job, dm, 1, epochs, nodes=2, num_nodes=2))
    one = values(run_world(2, node_job, dm, 2, epochs))
    where = ["rank 0 (stage 0 of 2, layers [0, 1])", "rank 1 (stage 1 of 2, layers [2, 3])"]
    assert [r["place"] for r in nodes] == [(r, 0, r, 2, where[r]) for r in range(2)]
    assert [r["place"] for r in one] == [(0, r, r, 2, where[r]) for r in range(2)]
    assert [r["environment"] for r in nodes] == ["TorchElasticEnvironment"] * 2
    assert len(nodes[0]["losses"]) == epochs and all(r["losses"] == one[0]["losses"] for r in nodes + one)
    reference = chunked_reference(GCNModule(16, 32, 4, 4), graph, dm.plan, epochs)
    torch.testing.assert_close(nodes[0]["losses"], reference, atol=1e-6, rtol=0)


class EvalGNN(GNNModule):
    """``GNNModule`` around any model, logging a validation loss too (plain SGD)."""

    def validation_step(self, batch, batch_idx):
        for name, value in val_metrics(self(batch.x, batch.edge_index), batch).items():
            self.log(name, value, batch_size=1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


EVAL_MODELS = {  # the sparse path, x0 beside h, the edge-list path, node-wise blocks around residual layers
    "gcn": lambda: GCN(16, 32, 4, 4),
    "gcnii": lambda: GCNII(16, 32, 4, num_layers=4, dropout=0.0),
    "gat": lambda: GAT(16, 8, 4, 4, heads=2),
    "resgcn": lambda: ResGCN(16, 32, 2, 4),
    # stages built with other chunk graphs (sparse GCN, then edge-list GAT) than the whole model needs
    "gcn_then_gat": lambda: BlockStack([GCNConv(16, 32), NodeWise(nn.ReLU()), GATConv(32, 4)]),
}


def val_losses_job(dm, devices, model, evaluation):
    """Fit 3 epochs, validating after each; return this rank's per-epoch validation losses."""
    torch.manual_seed(0)
    out = fit_rank(EvalGNN(EVAL_MODELS[model]()), dm, devices, 3, strategy_kwargs={"evaluation": evaluation})
    return [float(m["val_loss"]) for m in out["metrics"]]


@pytest.mark.parametrize("devices,model", [(2, "gcn"), (3, "gcn"), (2, "gcnii"), (2, "gat"), (2, "resgcn"),
                                           (2, "gcn_then_gat")])
def test_graph_parallel_evaluation_during_fit_equals_the_pipelined_one(graph, devices, model):
    """Validation inside a fit: every rank takes its chunks through all layers (``evaluation="graph_parallel"``, the
    default) with the weights each stage trained since, and gets the pipelined exact forward's metrics."""
    dm = GraphChunkDataModule(graph, num_chunks=4)
    split = values(run_world(devices, val_losses_job, dm, devices, model, "graph_parallel"))
    pipelined = values(run_world(devices, val_losses_job, dm, devices, model, "pipeline"))
    assert all(r == pipelined[0] for r in pipelined)  # every rank logs the same
    assert all(len(r) == 3 and max(abs(a - b) for a, b in zip(r, pipelined[0])) <= 1e-6 for r in split), \
        (split, pipelined)
    assert abs(pipelined[0][0] - pipelined[0][-1]) > 1e-3  # the weights moved


def test_graph_parallel_evaluation_is_refused_where_it_cannot_run(graph):
    with pytest.raises(ValueError, match=r"evaluation='graph_parallel'` needs graph_parallel_size=1 \(got 2\)"):
        GNNPipeStrategy(evaluation="graph_parallel", graph_parallel_size=2)
    with pytest.raises(ValueError, match=r"`evaluation` must be one of .* \(got 'split'\)"):
        GNNPipeStrategy(evaluation="split")
    # fewer chunks than stage ranks: refused when named, before any process starts; "auto" runs the pipelined forward
    trainer = Trainer(accelerator="cpu", devices=2, strategy=GNNPipeStrategy(evaluation="graph_parallel"),
                      max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False)
    with pytest.raises(ValueError, match=r"needs num_chunks >= 2 \(got 1\)"):
        trainer.fit(EvalGCN(16, 32, 4, 4), datamodule=GraphChunkDataModule(graph, num_chunks=1))
    assert resolve_evaluation("auto", 1, 1, 2) == "pipeline" and resolve_evaluation("auto", 1, 4, 2) == \
        "graph_parallel" and resolve_evaluation("auto", 2, 8, 2) == "pipeline"
    assert resolve_evaluation("auto", 1, 4, 2, autocast=True) == "pipeline"  # bf16-mixed rounds at stage boundaries
    # the bytes, once the chunk plan gives them: at most AUTO_MAX_BYTES_RATIO times the pipelined forward's
    assert resolve_evaluation("auto", 1, 4, 2, bytes_ratio=lambda: AUTO_MAX_BYTES_RATIO) == "graph_parallel"
    assert resolve_evaluation("auto", 1, 4, 2, bytes_ratio=lambda: 1.01 * AUTO_MAX_BYTES_RATIO) == "pipeline"
    assert resolve_evaluation("graph_parallel", 1, 4, 2, bytes_ratio=lambda: 10.0) == "graph_parallel"  # named


def test_auto_evaluation_weighs_the_bytes_of_both_ways():
    """A path of 8 nodes in chunks {0..3} and {4..7}, 2 stages of 2 layers each: each group's halo is one node."""
    plan = ChunkPlan(torch.tensor([0] * 4 + [1] * 4), [torch.arange(4), torch.arange(4, 8)],
                     [torch.tensor([4]), torch.tensor([3])], 0.0)
    gcn = [GCNConv(16, 16) for _ in range(4)]
    # graph-parallel: 2 halo rows x 16 wide before layers 1, 2, 3 = 96; pipelined: 8 rows x 16 at one boundary = 128
    assert exchange_bytes_ratio(gcn, plan, 2, [16] * 5, [[0, 1], [2, 3]]) == 96 / 128
    # with x0 beside h (GCNII) the boundary carries 8 x 16 more; a node-wise head adds no exchange
    gcnii = list(find_layer_stack(GCNII(16, 16, 4, num_layers=3, dropout=0.0)).blocks)  # input, 3 layers, output
    assert exchange_bytes_ratio(gcnii, plan, 2, [16] * 5 + [4], [[0, 1, 2], [3, 4]]) == (2 * 16 * 3) / (8 * 32)
    # ... unless the later stage computes x0 itself
    assert exchange_bytes_ratio(gcnii, plan, 2, [16] * 5 + [4], [[0, 1, 2], [3, 4]], x0_sent=False) == \
        (2 * 16 * 3) / (8 * 16)
    # every node in the other group's halo, 8 layers: 8 x 16 x 7 over 8 x 16 -> 7 > AUTO_MAX_BYTES_RATIO
    dense = ChunkPlan(plan.part, plan.nodes, [torch.arange(4, 8), torch.arange(4)], 0.0)
    assert exchange_bytes_ratio([GCNConv(16, 16) for _ in range(8)], dense, 2, [16] * 9,
                                [[0, 1, 2, 3], [4, 5, 6, 7]]) == 7.0 > AUTO_MAX_BYTES_RATIO


class DtypeGCN(EvalGNN):
    """``EvalGNN`` that also logs, per validation, whether its logits came in float32 (a ``Linear`` head under
    autocast computes bfloat16)."""

    def validation_step(self, batch, batch_idx):
        out = self(batch.x, batch.edge_index)
        self.log("logits_float32", float(out.dtype == torch.float32), batch_size=1)
        for name, value in val_metrics(out.float(), batch).items():
            self.log(name, value, batch_size=1)


def bf16_job(dm, evaluation):
    torch.manual_seed(0)
    head = BlockStack([GCNConv(16, 32), NodeWise(nn.ReLU()), GCNConv(32, 32), NodeWise(nn.Linear(32, 4))])
    out = fit_rank(DtypeGCN(head), dm, 2, 2, strategy_kwargs={"evaluation": evaluation},
                   precision="bf16-mixed")
    return [(float(m["val_loss"]), float(m["logits_float32"])) for m in out["metrics"]]


def test_graph_parallel_evaluation_named_under_bf16_mixed(graph):
    """Named explicitly under ``bf16-mixed`` (``"auto"`` would keep the pipelined forward): the logits come in the
    features' dtype, as the pipelined forward's do, and the metrics are the pipelined forward's (measured: equal)."""
    dm = GraphChunkDataModule(graph, num_chunks=4)
    split = values(run_world(2, bf16_job, dm, "graph_parallel"))
    pipelined = values(run_world(2, bf16_job, dm, "pipeline"))
    assert all(flag == 1.0 for r in split + pipelined for _, flag in r)
    assert all(max(abs(a[0] - b[0]) for a, b in zip(r, pipelined[0])) <= 1e-5 for r in split), (split, pipelined)


def release_job(dm):
    """Fit 3 epochs with validation; record every release of the features' pages by the graph-parallel evaluation."""
    from lightning_gnnpipe.strategy import graph_parallel_eval

    released = []
    graph_parallel_eval.release_shared_pages = lambda tensors: released.extend(
        t.data_ptr() == dm.data.x.data_ptr() for t in tensors)
    out = fit_rank(EvalGCN(16, 32, 4, 4), dm, 2, 3, strategy_kwargs={"evaluation": "graph_parallel"})
    return released, len(out["metrics"])


def test_graph_parallel_evaluation_releases_the_features_off_the_first_stage(graph):
    """The rank without the first stage reads the features only to evaluate; it lets go of their pages after each
    evaluation and refresh (in shared memory, as spawned ranks hold them, that shrinks its resident set), the other
    rank never."""
    dm = GraphChunkDataModule(graph, num_chunks=4)
    (first, epochs0), (second, epochs1) = values(run_world(2, release_job, dm))
    assert epochs0 == epochs1 == 3
    assert first == [] and second == [True] * 4, (first, second)  # the refresh at fit start, then 3 validations


class TableSnapshots(Callback):
    """Copies of this rank's history tables after each validation."""

    def __init__(self) -> None:
        self.tables = []

    def on_validation_epoch_end(self, trainer, pl_module):
        stages = trainer.strategy._runtime.stages
        self.tables.append({k: t.emb.clone() for s in stages for k, t in s.histories.items()})


def refresh_job(dm, devices, model, evaluation):
    """Fit 3 epochs with a refresh before each (``refresh_every=1``); this rank's tables after each validation, the
    training losses, the logged drift and how often the pipelined exact forward ran."""
    from lightning_gnnpipe.pipeline.runtime import PipelineRuntime

    calls, original = [], PipelineRuntime.full_forward
    PipelineRuntime.full_forward = lambda self, *a, **k: calls.append(1) or original(self, *a, **k)
    try:
        torch.manual_seed(0)
        snap = TableSnapshots()
        out = fit_rank(EvalGNN(EVAL_MODELS[model]()), dm, devices, 3, callbacks=[snap],
                       strategy_kwargs={"evaluation": evaluation, "refresh_every": 1})
    finally:
        PipelineRuntime.full_forward = original
    drift = [{k: v for k, v in m.items() if k.startswith("gnnpipe/drift")} for m in out["metrics"]]
    return {"tables": snap.tables, "losses": out["losses"], "drift": drift, "pipelined": len(calls)}


@pytest.mark.parametrize("devices,model", [(2, "gcnii"), (3, "gcn")])
def test_graph_parallel_refresh_fills_the_tables_as_the_pipelined_one(graph, devices, model):
    """With ``refresh_every=1`` every validation but the last is a refresh: graph-parallel, each rank sends its
    part's table rows to the table's stage; the tables, the drift and the training that reads them equal the
    pipelined refresh's, and no pipelined forward runs."""
    dm = GraphChunkDataModule(graph, num_chunks=4)
    split = values(run_world(devices, refresh_job, dm, devices, model, "graph_parallel"))
    piped = values(run_world(devices, refresh_job, dm, devices, model, "pipeline"))
    assert all(r["pipelined"] == 0 for r in split) and all(r["pipelined"] >= 3 for r in piped)
    for a, b in zip(split, piped):  # rank by rank
        assert len(a["tables"]) == 3 and a["tables"][0]
        for ta, tb in zip(a["tables"][:2], b["tables"][:2]):  # the last validation is no refresh
            assert ta.keys() == tb.keys()
            for k in ta:
                torch.testing.assert_close(ta[k], tb[k], atol=1e-5, rtol=1e-5)
        assert any(not torch.allclose(a["tables"][0][k], a["tables"][1][k]) for k in a["tables"][0])  # rewritten
        torch.testing.assert_close(a["losses"], b["losses"], atol=1e-5, rtol=0)
        assert a["drift"][1] and a["drift"][1].keys() == b["drift"][1].keys()
        for k in a["drift"][1]:
            assert abs(a["drift"][1][k] - b["drift"][1][k]) <= 1e-4 * max(1.0, abs(b["drift"][1][k]))
