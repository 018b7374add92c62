"""Wire checks: every tensor handed to ``torch.distributed`` in every mode is one NCCL would take (``tests/wire.py``),
and the graph goes to the device once, not at every step.

Each test runs multi-process fits on a world of forked gloo ranks with the check entered inside every rank. NCCL
refuses what gloo accepts: a non-contiguous tensor, a tensor on another device than the process group's, or a dtype
it has no type for; under the check such a tensor fails the CPU run as it would fail a CUDA one. On the CPU every
tensor is on the CPU, so the device rule can only fail on a GPU (``checks/gpu_check.py`` runs its fits under the
same check).
"""

import functools
import os
from datetime import timedelta

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_gnnpipe import GraphChunkDataModule, GraphParallelStrategy
from tests.helpers import ChunkLossGCN, GCNModule, sbm_graph
from tests.scenarios import DropoutGCN
from tests.wire import WireCheck, graph_bytes, wire_job
from tests.world import run_world, values

P2P = {"isend", "irecv"}  # torch.distributed.pipelining's stage transfers


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=300)


def _agree(results):
    """Every rank's result; the ranks logged the same losses."""
    out = values(results)
    assert all(r["fits"][i]["losses"] == out[0]["fits"][i]["losses"] for r in out for i in range(len(out[0]["fits"])))
    return out


def _graph_moved_once(result, graph):
    """The graph went to the device in the first fit's setup, once (later fits of the same DataModule on the same
    device reuse that copy), and no byte of it in any step or validation after."""
    moved = graph_bytes(graph) - graph.edge_index.numel() * 8  # the edge list stays on the host (graph_on_host)
    assert [fit["setup"] for fit in result["fits"]] == [(1, moved)] + [(0, 0)] * (len(result["fits"]) - 1)
    for fit in result["fits"]:
        assert fit["training"] == (0, 0) and fit["steps"] > 0, fit


def _check_refuses(tensor, match):
    with pytest.raises(AssertionError, match=match):
        WireCheck("cpu").check("send", tensor, "tensor")


def _send_transposed(timeout_s: float) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    with WireCheck("cpu"):
        if dist.get_rank() == 0:
            dist.send(torch.arange(12.0).view(3, 4).t(), dst=1)  # a (4, 3) view with strides (1, 4)
        else:
            dist.recv(torch.empty(4, 3), src=0)


def test_wire_check_refuses_what_nccl_refuses():
    """A non-contiguous send fails the run on the sending rank with the check's message (gloo alone would send it);
    so do a dtype NCCL has no type for and a tensor off the root device."""
    results = run_world(2, _send_transposed, 10.0, timeout=60)
    assert results[0].exitcode == 1
    assert ("AssertionError: wire check: torch.distributed.send got `tensor` of shape (4, 3), dtype torch.float32, "
            "device cpu: not contiguous (strides (1, 4))") in results[0].error
    assert results[1].exitcode != 0  # the receiver does not wait forever
    _check_refuses(torch.zeros(3, dtype=torch.int16), "a dtype NCCL does not carry")
    _check_refuses(torch.zeros(3, device="meta"), "not on the root device cpu")
    WireCheck("cpu").check("send", torch.zeros(3, 2, dtype=torch.bfloat16), "tensor")  # taken


def test_wire_gnnpipe_gpipe_with_validation_checkpoints_and_resume(tmp_path, graph):
    """GPipe with dropout, validation every epoch and the history tables in every checkpoint, then a resume from
    the first checkpoint: all their transfers pass; the resume continues bit for bit; ``ModelCheckpoint`` removes
    an old checkpoint's directory of tables with it; the graph moves to the device once per fit."""
    dm = GraphChunkDataModule(graph, num_chunks=4)
    model = functools.partial(DropoutGCN, 16, 32, 4, 4)
    opts = {"strategy_kwargs": {"schedule": "gpipe", "save_history": True}, "limit_val_batches": 1.0, "devices": 2,
            "epochs": 3, "datamodule": dm}
    keep_one = ModelCheckpoint(dirpath=str(tmp_path / "one"), save_top_k=1, filename="{epoch}", every_n_train_steps=1)
    runs = [dict(module=model(), ckpt_dir=str(tmp_path / "ckpt"), callbacks=[keep_one], **opts),
            dict(module=model(), ckpt_path=str(tmp_path / "ckpt" / "epoch=0.ckpt"), **opts)]
    out = _agree(run_world(2, wire_job, runs, timeout=240))
    calls = out[0]["wire"]["calls"]
    print("wire calls (rank 0):", dict(sorted(calls.items())))
    for result in out:
        # point-to-point transfers are isend/irecv (the stages') and, by torch release, blocking send/recv too
        assert P2P | {"broadcast", "all_gather", "all_reduce", "gather"} <= set(result["wire"]["calls"])
        assert "torch.float32" in result["wire"]["dtypes"]["isend"]
        _graph_moved_once(result, graph)
    full, resumed = out[0]["fits"][0]["losses"], out[0]["fits"][1]["losses"]
    assert len(full) == 3 and resumed == full[1:]
    assert sorted(os.listdir(tmp_path / "one")) == ["epoch=2.ckpt", "epoch=2.ckpt.history"]


def test_wire_gnnpipe_1f1b_bf16_clipping_and_zbv(graph):
    """1F1B under bf16-mixed with global-norm clipping (bfloat16 activations between the stages), then ZB-V with two
    stages on each rank (interleaved zero bubble on a torch that cannot run ZB-V)."""
    from lightning_gnnpipe.pipeline.schedule import unavailable

    dm = GraphChunkDataModule(graph, num_chunks=4)
    two_stages = "zbv" if unavailable("zbv") is None else "interleaved_zb"
    runs = [dict(module=ChunkLossGCN(16, 32, 4, 4), datamodule=dm, devices=2, epochs=2, precision="bf16-mixed",
                 gradient_clip_val=0.5, strategy_kwargs={"schedule": "1f1b"}),
            dict(module=ChunkLossGCN(16, 32, 4, 4), datamodule=dm, devices=2, epochs=2,
                 strategy_kwargs={"schedule": two_stages, "stages_per_rank": 2})]
    out = _agree(run_world(2, wire_job, runs, timeout=240))
    for result in out:
        wire = result["wire"]
        assert P2P <= set(wire["calls"]) and "all_reduce" in wire["calls"]  # stage transfers, the global norm
        assert {"torch.bfloat16", "torch.float32"} <= set(wire["dtypes"]["isend"])  # bf16 fit, then fp32 ZB-V
        _graph_moved_once(result, graph)


def test_wire_graph_parallel(graph):
    dm = GraphChunkDataModule(graph, num_chunks=2)
    runs = [dict(module=GCNModule(16, 32, 4, 4), datamodule=dm, devices=2, epochs=2, limit_val_batches=1.0,
                 strategy_cls=GraphParallelStrategy)]
    out = _agree(run_world(2, wire_job, runs, timeout=240))
    for result in out:
        assert {"all_to_all_single", "all_reduce", "all_gather", "broadcast"} <= set(result["wire"]["calls"])
        _graph_moved_once(result, graph)


def test_wire_hybrid(graph):
    """2 stages x 2 partitions: stage transfers, halo rows between the partitions, summed gradients and logits."""
    dm = GraphChunkDataModule(graph, num_chunks=8, num_parts=2)
    runs = [dict(module=GCNModule(16, 32, 4, 4), datamodule=dm, devices=4, epochs=2, limit_val_batches=1.0,
                 strategy_kwargs={"graph_parallel_size": 2})]
    out = _agree(run_world(4, wire_job, runs, timeout=240))
    for result in out:
        assert P2P | {"all_to_all_single", "all_reduce", "broadcast"} <= set(result["wire"]["calls"])
        _graph_moved_once(result, graph)
