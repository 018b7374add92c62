"""Mixed precision, global-norm clipping and per-epoch insight (TensorBoard, progress bar, traces)."""

import glob
import json
import os

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins.precision import HalfPrecision, MixedPrecision, Precision
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, GraphParallelStrategy
from lightning_gnnpipe.strategy.precision import check_precision, global_norm_clipping
from tests.helpers import GCNModule, MetricRecorder, fit, losses, read_metrics, sbm_graph
from tests.precision_helpers import MetricGCN, ProgressBarRecorder, SGDGCN

EPOCHS = 5
# Measured (K = 1, 2 stages, 5 epochs): the pipeline equals the single-device bf16 run exactly (0.0), while bf16
# differs from float32 by up to 5.3e-4. The bfloat16 boundary rounds what the next layer's matmul rounds to
# bfloat16 under autocast anyway, so only summation-order noise may appear: 1e-6, 500x below the bf16 effect.
TOL_BF16 = 1e-6
F_IN, HIDDEN, LAYERS, CLASSES = 16, 32, 4, 4


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=400)


def test_global_norm_clipping_equals_single_device(tmp_path, graph):
    # SGD (lr 0.5): the gradient norm is 0.1-0.5 here, so a clip value of 0.02 changes every step
    # (Adam would hide clipping: it is invariant to a common gradient scale).
    dm = GraphChunkDataModule(graph, num_chunks=1)
    clip = dict(gradient_clip_val=0.02)
    model = lambda: SGDGCN(F_IN, HIDDEN, LAYERS, CLASSES, lr=0.5)  # noqa: E731
    single = losses(fit(str(tmp_path / "s"), model(), dm, devices=1, epochs=EPOCHS, **clip)[0])
    unclipped = losses(fit(str(tmp_path / "u"), model(), dm, devices=1, epochs=EPOCHS)[0])
    assert abs(single[-1] - unclipped[-1]) > 1e-3  # clipping is active
    pipe = fit(str(tmp_path / "p"), model(), dm, devices=2, strategy=GNNPipeStrategy(), epochs=EPOCHS, **clip)
    torch.testing.assert_close(losses(pipe[1]), single, atol=1e-5, rtol=0)
    # Measured once (not run here, to keep the suite short): GraphParallelStrategy with 2 and 4 parts equals
    # `single` exactly (its gradients are all-reduced, so Lightning's local norm is global); clipping each
    # stage by its own norm ends at 1.37856 instead of 1.37988.


@pytest.fixture(scope="module")
def bf16_run(graph, tmp_path_factory):
    """One bf16-mixed GNNPipe fit (K = 1, 2 stages) with TensorBoard and a trace of epoch 1; its directory."""
    tmp = tmp_path_factory.mktemp("bf16")
    dm = GraphChunkDataModule(graph, num_chunks=1)
    strategy = GNNPipeStrategy(profile_epoch=1, trace_dir=str(tmp / "traces"))
    fit(str(tmp), MetricGCN(F_IN, HIDDEN, LAYERS, CLASSES), dm, devices=2, strategy=strategy, epochs=EPOCHS,
        precision="bf16-mixed", logger=TensorBoardLogger(str(tmp), name="run"), log_every_n_steps=1,
        callbacks=[MetricRecorder(str(tmp)), ProgressBarRecorder(str(tmp))])
    return tmp


def test_bf16_mixed_matches_single_device_bf16(tmp_path, graph, bf16_run):
    dm = GraphChunkDataModule(graph, num_chunks=1)
    model = lambda: MetricGCN(F_IN, HIDDEN, LAYERS, CLASSES)  # noqa: E731
    fp32 = losses(fit(str(tmp_path / "f"), model(), dm, devices=1, epochs=EPOCHS)[0])
    single = losses(fit(str(tmp_path / "s"), model(), dm, devices=1, epochs=EPOCHS, precision="bf16-mixed")[0])
    ranks = [read_metrics(str(bf16_run), r) for r in range(2)]
    pipe = losses(ranks[1])
    assert max(abs(a - b) for a, b in zip(single, fp32)) > 1e-4  # autocast did run in bfloat16
    torch.testing.assert_close(pipe, single, atol=TOL_BF16, rtol=0)
    assert pipe[-1] < pipe[0] - 0.05  # it trains
    # The stage boundary carries bfloat16: |V| rows of width HIDDEN, 2 bytes each, one chunk.
    assert ranks[0][-1]["comm/sent/stage_activations"] == graph.num_nodes * HIDDEN * 2
    assert ranks[0][-1]["comm/sent/stage_gradients"] == graph.num_nodes * HIDDEN * 2


def test_tensorboard_insight_and_trace(bf16_run):
    tmp_path, epochs = bf16_run, EPOCHS
    ranks = [read_metrics(str(tmp_path), r) for r in range(2)]

    # One run directory, one event file (rank 0 writes), every listed scalar once per epoch.
    runs = glob.glob(str(tmp_path / "run" / "version_*"))
    assert len(runs) == 1
    events = glob.glob(os.path.join(runs[0], "events.*"))
    assert len(events) == 1
    acc = EventAccumulator(events[0])
    acc.Reload()
    scalars = {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    per_rank = ["comm/compute_s", "comm/bubble_fraction", "memory/peak_bytes"]
    listed = ["train_loss", "train_acc", "val_acc", "time/epoch_s", "comm/sent_total",
              "gnnpipe/stale_edge_fraction"] + [f"{k}/rank{r}" for k in per_rank for r in range(2)]
    assert {tag: len(scalars.get(tag, [])) for tag in listed} == dict.fromkeys(listed, epochs)

    torch.testing.assert_close(scalars["train_loss"], losses(ranks[1]), atol=1e-6, rtol=0)
    # torchmetrics syncs its state over the ranks; the value stays the plain accuracy of the labelled nodes.
    torch.testing.assert_close(scalars["train_acc"], scalars["train_acc_plain"], atol=1e-6, rtol=0)
    for r in range(2):
        fraction = [m[f"comm/bubble_s/rank{r}"] / m[f"comm/step_s/rank{r}"] for m in ranks[0]]
        torch.testing.assert_close(scalars[f"comm/bubble_fraction/rank{r}"], fraction, atol=1e-6, rtol=1e-5)
        assert all(0 < f < 1 for f in fraction)
        assert all(2**24 < b < 2**36 for b in scalars[f"memory/peak_bytes/rank{r}"])  # 16 MiB .. 64 GiB of RSS
    step = [max(m[f"comm/step_s/rank{r}"] for r in range(2)) for m in ranks[0]]
    assert all(t >= s for t, s in zip(scalars["time/epoch_s"], step))  # the epoch contains the step
    assert ranks[0] == ranks[1]  # every rank logs the gathered values

    bar = json.loads((tmp_path / "progress_bar.rank0.json").read_text())
    assert {"train_loss", "train_acc", "time/epoch_s"} <= set(bar)

    # One Chrome trace per rank of epoch 1's step, with the schedule's micro-batch markers.
    for r in range(2):
        trace = json.loads((tmp_path / "traces" / f"gnnpipe_epoch1_rank{r}.json").read_text())
        names = {e.get("name") for e in trace["traceEvents"]}
        assert {"Forward 0", "Backward 0"} <= names
    assert sorted(os.listdir(tmp_path / "traces")) == [f"gnnpipe_epoch1_rank{r}.json" for r in range(2)]


def test_precision_checks_and_wrapper(graph):
    check_precision(Precision())
    check_precision(MixedPrecision("bf16-mixed", "cpu"))
    with pytest.raises(ValueError, match=r"precision '16-mixed' is not supported \(got MixedPrecision\)"):
        check_precision(MixedPrecision("16-mixed", "cuda"))
    with pytest.raises(ValueError, match=r"precision 'bf16-true' is not supported \(got HalfPrecision\)"):
        check_precision(HalfPrecision("bf16-true"))
    plugin = MixedPrecision("bf16-mixed", "cpu")
    wrapped = global_norm_clipping(plugin)
    assert isinstance(wrapped, MixedPrecision) and type(plugin) is MixedPrecision  # the original is untouched
    # no state, so Lightning writes no entry of the plugin into a checkpoint (as for a single device's)
    assert wrapped.state_dict() == {} and global_norm_clipping(Precision()).state_dict() == {}
    assert type(global_norm_clipping(wrapped)) is type(wrapped)
    check_precision(wrapped)
    trainer = Trainer(accelerator="cpu", devices=2, strategy=GraphParallelStrategy(), precision="bf16-true",
                      logger=False, enable_progress_bar=False, enable_checkpointing=False)
    with pytest.raises(ValueError, match=r"GraphParallelStrategy: precision 'bf16-true' is not supported"):
        trainer.fit(GCNModule(F_IN, HIDDEN, LAYERS, CLASSES), datamodule=GraphChunkDataModule(graph, num_chunks=2))
    with pytest.raises(ValueError, match=r"`profile_epoch` must be None or an int >= 0 epochs \(got -1\)"):
        GNNPipeStrategy(profile_epoch=-1)


@pytest.mark.parametrize("strategy_cls", [GNNPipeStrategy, GraphParallelStrategy])
def test_trace_dir_needs_a_profile_epoch(strategy_cls, tmp_path):
    with pytest.raises(ValueError, match=r"`trace_dir` \('traces'\) is set but `profile_epoch` is None, so no trace "
                                         r"would be written\. Pass profile_epoch=<epoch>"):
        strategy_cls(trace_dir="traces")
    assert strategy_cls(trace_dir="traces", profile_epoch=0).insight.trace_dir == "traces"


@pytest.mark.parametrize("epoch,start,warns", [(3, 0, True), (0, 1, True), (2, 0, False), (1, 1, False)])
def test_a_profile_epoch_the_fit_does_not_train_warns(epoch, start, warns, tmp_path):
    """``max_epochs=3`` trains epochs 0-2; a resumed fit starts at ``start``."""
    import warnings
    from types import SimpleNamespace

    trainer = SimpleNamespace(max_epochs=3, current_epoch=start, log_dir=str(tmp_path), default_root_dir=str(tmp_path))
    insight = GNNPipeStrategy(profile_epoch=epoch).insight
    if warns:
        with pytest.warns(UserWarning, match=rf"`profile_epoch` \({epoch}\) is not among the epochs this fit trains "
                                             rf"\({start} to 2\), so no trace is written"):
            insight.on_train_start(trainer, None)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            insight.on_train_start(trainer, None)
    assert insight.trace_dir == str(tmp_path / "traces")
