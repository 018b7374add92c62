"""Bad input fails with a clear message, before any process group starts."""

import re

import pytest
import torch
from lightning.pytorch import Trainer
from torch_geometric.nn import SGConv

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, find_layer_stack
from lightning_gnnpipe.pipeline.schedule import SCHEDULES, check_schedule
from lightning_gnnpipe.pipeline.split import split_layers
from tests.helpers import ChunkLossGCN, GCNModule, sbm_graph


@pytest.fixture()
def graph():
    return sbm_graph(num_nodes=60)


def _fit(module, dm, devices=2, **kwargs):
    trainer = Trainer(accelerator="cpu", devices=devices, strategy=GNNPipeStrategy(**kwargs), max_epochs=1,
                      logger=False, enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(module, datamodule=dm)


@pytest.mark.parametrize("mutate,error,match", [
    (lambda d: setattr(d, "edge_index", d.edge_index.int()), TypeError, "must have dtype torch.long"),
    (lambda d: setattr(d, "edge_index", d.edge_index.t().contiguous()), ValueError, r"shape \(2, num_edges\)"),
    (lambda d: d.edge_index.__setitem__((0, 0), -1), ValueError, "outside"),
    (lambda d: d.edge_index.__setitem__((0, 0), 60), ValueError, r"outside \[0, 60\)"),
    (lambda d: d.x.__setitem__((3, 1), float("nan")), ValueError, "NaN or Inf"),
    (lambda d: d.x.__setitem__((5, 0), float("inf")), ValueError, r"NaN or Inf \(got 1 bad rows\)"),
    (lambda d: setattr(d, "y", d.y[:-1]), ValueError, "one entry per node"),
    (lambda d: setattr(d, "train_mask", d.train_mask[:-2]), ValueError, r"shape \(60,\)"),
    (lambda d: setattr(d, "val_mask", torch.zeros(60, dtype=torch.bool)), ValueError, "selects no node"),
    (lambda d: d.y.__setitem__(d.train_mask.nonzero()[0], -1), ValueError, "unlabelled"),
    (lambda d: d.y.__setitem__(d.val_mask, -1), ValueError, r"`data.val_mask` selects unlabelled nodes"),
    (lambda d: setattr(d, "test_mask", d.test_mask.long()), TypeError, "torch.bool"),
])
def test_bad_graph(graph, mutate, error, match):
    mutate(graph)
    with pytest.raises(error, match=match):
        GraphChunkDataModule(graph, num_chunks=2)


@pytest.mark.parametrize("num_chunks,error", [(0, ValueError), (61, ValueError), (2.0, TypeError)])
def test_bad_num_chunks(graph, num_chunks, error):
    with pytest.raises(error, match="num_chunks"):
        GraphChunkDataModule(graph, num_chunks=num_chunks)


def test_unknown_schedule():
    with pytest.raises(ValueError, match=r"unknown `schedule` 'zb'. Valid schedules: \['auto', '1f1b', 'gpipe', "
                                         r"'interleaved_1f1b', 'interleaved_zb', 'looped_bfs', 'zbv'\]"):
        GNNPipeStrategy(schedule="zb")


@pytest.mark.parametrize("kwargs,match", [
    (dict(schedule="gpipe", stages_per_rank=2), r"'gpipe' runs one stage per rank, so `stages_per_rank` must be 1 "
                                                r"\(got stages_per_rank=2\)"),
    (dict(schedule="1f1b", stages_per_rank=3), r"must be 1 \(got stages_per_rank=3\)"),
    (dict(stages_per_rank=2), r"schedule 'auto' chooses between 'gpipe' and '1f1b', one stage per rank, so "
                              r"`stages_per_rank` must be 1 \(got stages_per_rank=2\)"),
    (dict(schedule="interleaved_1f1b"), r"'interleaved_1f1b' runs several stages per rank, so `stages_per_rank` "
                                        r"must be at least 2 \(got stages_per_rank=1\)"),
    (dict(schedule="looped_bfs", stages_per_rank=1), r"at least 2 \(got stages_per_rank=1\)"),
    (dict(schedule="zbv", stages_per_rank=3), r"'zbv' places exactly 2 stages on each rank .* must be 2 "
                                              r"\(got stages_per_rank=3\)"),
    (dict(schedule="interleaved_zb", stages_per_rank=0), r"`stages_per_rank` must be an int >= 1 \(got 0\)"),
    (dict(schedule="interleaved_zb", stages_per_rank=2, halo_gradients="stale"),
     r"`halo_gradients='stale'` is not supported with the multi-stage schedule 'interleaved_zb'"),
    (dict(schedule="zbv", stages_per_rank=2, graph_parallel_size=2),
     r"multi-stage schedule 'zbv' is not supported with hybrid parallelism \(got graph_parallel_size=2\)"),
])
def test_bad_stages_per_rank(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GNNPipeStrategy(**kwargs)


@pytest.mark.parametrize("version,refused", [("2.11.0+cu130", True), ("2.12.1", True), ("2.13.0+cpu", False)])
def test_zbv_is_refused_on_a_torch_that_cannot_run_it(monkeypatch, version, refused):
    """On torch 2.11 ZB-V's stages fail to connect ("Pair is not connected"): the strategy refuses it when it is built,
    naming the schedule, the torch found and the torch needed."""
    monkeypatch.setattr(torch, "__version__", version)
    if not refused:
        GNNPipeStrategy(schedule="zbv", stages_per_rank=2)
        return
    with pytest.raises(ValueError, match=rf"schedule 'zbv' needs torch >= 2.13 \(got torch {re.escape(version)}\)"):
        GNNPipeStrategy(schedule="zbv", stages_per_rank=2)
    GNNPipeStrategy(schedule="interleaved_zb", stages_per_rank=2)  # the other multi-stage schedules run there


def test_more_virtual_stages_than_layers(graph):
    with pytest.raises(ValueError, match=r"the model has 4 layers but 2 devices x 3 `stages_per_rank` = 6 virtual "
                                         r"stages"):
        _fit(ChunkLossGCN(16, 8, 4, 4), GraphChunkDataModule(graph, num_chunks=4), schedule="looped_bfs",
             stages_per_rank=3)


def test_multi_stage_schedules_need_valid_chunks(graph):
    with pytest.raises(ValueError, match=r"'interleaved_1f1b' runs the `num_chunks` micro-batches in "
                                         r"max\(1, K // S\) = 2 rounds, so K must be a multiple of 2 "
                                         r"\(got num_chunks=5, num_stages=2\)"):
        _fit(ChunkLossGCN(16, 8, 4, 4), GraphChunkDataModule(graph, num_chunks=5), schedule="interleaved_1f1b",
             stages_per_rank=2)


@pytest.mark.parametrize("name", ["interleaved_1f1b", "interleaved_zb", "looped_bfs", "zbv"])
def test_chunk_rule_is_torchs(name):
    # check_schedule accepts exactly the K for which torch builds the schedule (S = 2, 3, 4; v = 2).
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    for stages in (2, 3, 4):
        for chunks in range(1, 10):
            try:
                get_schedule_ops(SCHEDULES[name], stages, chunks, 2)
                torch_ok = True
            except ValueError:
                torch_ok = False
            try:
                check_schedule(name, chunks, stages, 2)
                ours = True
            except ValueError:
                ours = False
            assert ours == torch_ok, (name, stages, chunks)


def test_more_stages_than_layers(graph):
    with pytest.raises(ValueError, match="the model has 2 layers but 3 stages"):
        _fit(GCNModule(16, 8, 2, 4), GraphChunkDataModule(graph, num_chunks=4), devices=3)
    with pytest.raises(ValueError, match="cannot place 2 layers on 3 stages"):
        split_layers(2, 3)


def test_1f1b_needs_enough_chunks(graph):
    # (a loss 1F1B cannot drive: tests/test_schedule_choice.py)
    with pytest.raises(ValueError, match=r"`num_chunks` \(1\) must be at least `num_stages` \(2\)"):
        _fit(GCNModule(16, 8, 2, 4), GraphChunkDataModule(graph, num_chunks=1), schedule="1f1b")


def test_needs_graph_chunk_datamodule(graph):
    from torch.utils.data import DataLoader

    trainer = Trainer(accelerator="cpu", devices=2, strategy=GNNPipeStrategy(), max_epochs=1, logger=False)
    with pytest.raises(TypeError, match="GraphChunkDataModule"):
        trainer.fit(GCNModule(16, 8, 2, 4), train_dataloaders=DataLoader([graph], batch_size=None))


def test_model_without_layer_stack():
    with pytest.raises(TypeError, match="pipeline_blocks"):
        find_layer_stack(torch.nn.Linear(3, 3))


def test_multi_hop_conv_is_refused(graph):
    class Blocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([SGConv(16, 8, K=2), SGConv(8, 4, K=1)])

        def pipeline_blocks(self):
            return self.layers

    module = GCNModule(16, 8, 2, 4)
    module.gnn = Blocks()
    with pytest.raises(ValueError, match=r"SGConv\(K=2\)"):
        _fit(module, GraphChunkDataModule(graph, num_chunks=2))


@pytest.mark.parametrize("make,error,match", [
    (lambda n: torch.zeros(n), TypeError, "`part` must be a torch.long tensor"),
    (lambda n: torch.zeros(n - 1, dtype=torch.long), ValueError, r"`part` must have shape \(60,\)"),
    (lambda n: torch.arange(n) % 3, ValueError, r"chunk ids outside \[0, 2\) \(got min 0, max 2\)"),
    (lambda n: torch.zeros(n, dtype=torch.long), ValueError, r"empty chunks \[1\]"),
])
def test_bad_part(graph, make, error, match):
    with pytest.raises(error, match=match):
        GraphChunkDataModule(graph, num_chunks=2, part=make(60))


@pytest.mark.parametrize("dtype", ["bfloat", torch.int8, "long", 16])
def test_bad_history_dtype(dtype):
    with pytest.raises(ValueError, match=r"`history_dtype` must be a floating-point torch dtype or its name, e.g. "
                                         rf"torch.bfloat16 or 'bfloat16' \(got {re.escape(repr(dtype))}\)"):
        GNNPipeStrategy(history_dtype=dtype)


def test_history_dtype_names_become_torch_dtypes():
    assert GNNPipeStrategy(history_dtype="bfloat16").history_dtype is torch.bfloat16
    assert GNNPipeStrategy(history_dtype=torch.float16).history_dtype is torch.float16
    assert GNNPipeStrategy().history_dtype is None


def test_bad_start_method():
    with pytest.raises(ValueError, match="`start_method` must be 'spawn' or 'popen'"):
        GNNPipeStrategy(start_method="fork")


class HeadModule(GCNModule):
    """The issue's module: a trainable ``Linear`` head outside the GNN (the layer stack)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.head = torch.nn.Linear(4, 4)

    def forward(self, x, edge_index):
        return self.head(self.gnn(x, edge_index).relu())


class ManualModule(GCNModule):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.automatic_optimization = False


@pytest.mark.parametrize("strategy", ["gnnpipe", "graph_parallel"])
@pytest.mark.parametrize("make,trainer_kwargs,match", [
    (lambda: HeadModule(16, 8, 2, 4), {}, r"trainable parameters outside the layer stack \(got head.weight, head.bias\)"),
    (lambda: ManualModule(16, 8, 2, 4), {}, r"manual optimization is not supported"),
    (lambda: GCNModule(16, 8, 2, 4), {"accumulate_grad_batches": 2}, r"`accumulate_grad_batches` must be 1 \(got 2\)"),
])
def test_modules_that_would_train_differently_are_refused_before_spawn(graph, strategy, make, trainer_kwargs,
                                                                         match):
    from lightning_gnnpipe import GraphParallelStrategy

    chosen = GNNPipeStrategy() if strategy == "gnnpipe" else GraphParallelStrategy()
    trainer = Trainer(accelerator="cpu", devices=2, strategy=chosen, max_epochs=1, logger=False,
                      enable_progress_bar=False, enable_checkpointing=False, **trainer_kwargs)
    with pytest.raises(ValueError, match=match):
        trainer.fit(make(), datamodule=GraphChunkDataModule(graph, num_chunks=2))
