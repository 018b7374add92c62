"""NodeDropout: one mask per node and epoch, the same in the owner chunk and in every chunk that reads the node."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GCNConv

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, GraphParallelStrategy
from lightning_gnnpipe.nn import NodeDropout, node_rows
from lightning_gnnpipe.nn.dropout import node_mask
from lightning_gnnpipe.nn.gcnii import GCNII
from lightning_gnnpipe.nn.stack import BlockStack, NodeWise
from tests.helpers import GNNModule, fit, losses, sbm_graph
from tests.test_stage import make_stages


class DropConv(nn.Module):
    """Dropout on the layer's input, then GCNConv and ReLU."""

    def __init__(self, in_channels: int, out_channels: int, drop: nn.Module) -> None:
        super().__init__()
        self.drop, self.conv = drop, GCNConv(in_channels, out_channels)

    def forward(self, x, edge_index):
        return F.relu(self.conv(self.drop(x), edge_index))


def chunked_forward(plan, stages, x):
    """Run every chunk through the stages once, in chunk order (no refresh); return ``(|V|, C)``."""
    m, x_pad, out = plan.max_chunk_size, plan.pad(x), None
    for c in range(plan.num_chunks):
        h = (x_pad[c * m: (c + 1) * m],)
        for stage in stages:  # h, and h0 between the stages of GCNII
            h = stage(*h, chunk_id=torch.tensor([c]))
            h = h if isinstance(h, tuple) else (h,)
        h = h[0]
        out = torch.zeros(x.size(0), h.size(-1)) if out is None else out
        out[plan.nodes[c]] = h[: plan.nodes[c].numel()]
    return out


def test_mask_depends_only_on_seed_epoch_node_and_column():
    ids = torch.arange(20000)
    full = node_mask(ids, 64, 0.3, seed=7, epoch=2)
    perm = torch.randperm(ids.numel())[:500]
    assert torch.equal(node_mask(ids[perm], 64, 0.3, seed=7, epoch=2), full[perm])  # any subset, any order
    assert abs(float(full.float().mean()) - 0.7) < 0.005  # 1.28 M entries kept with probability 1 - p
    independent = 0.7 ** 2 + 0.3 ** 2  # probability that two independent entries agree
    assert abs(float((node_mask(ids, 64, 0.3, seed=7, epoch=3) == full).float().mean()) - independent) < 0.005
    assert abs(float((full[:, 0] == full[:, 1]).float().mean()) - independent) < 0.01  # columns are independent
    assert abs(float((full[:-1] == full[1:]).float().mean()) - independent) < 0.005  # so are neighbouring ids
    assert not torch.equal(node_mask(ids, 64, 0.3, seed=8, epoch=2), full)


def test_node_dropout_outside_a_context_and_in_eval():
    drop = NodeDropout(0.5, seed=1)
    x = torch.ones(100, 8)
    assert torch.equal(drop.eval()(x), x)
    drop.train()
    with node_rows(torch.arange(100) + 5, epoch=0):
        y = drop(x)
        assert torch.equal(drop(x), y)  # the same nodes in the same epoch: the same mask
    assert torch.equal(y, node_mask(torch.arange(100) + 5, 8, 0.5, 1, 0).float() * 2)
    with node_rows(torch.arange(100) + 5, epoch=1):
        assert not torch.equal(drop(x), y)
    assert int(drop.state_dict()["seed"]) == 1  # checkpointed and broadcast with the weights
    assert set(drop(x).unique().tolist()) <= {0.0, 2.0}  # no context: plain dropout
    with node_rows(torch.arange(99), epoch=0), pytest.raises(ValueError, match=r"\(99, d\) \(got \(100, 8\)\)"):
        drop(x)
    with pytest.raises(ValueError, match=r"shape \(R, d\) \(got \(100, 2, 4\)\)"):  # on one device too
        drop(x.view(100, 2, 4))
    with pytest.raises(ValueError, match=r"\[0, 1\) \(got 1.0\)"):
        NodeDropout(1.0)
    with pytest.raises(ValueError, match=r"1-D integer tensor of node ids \(got dtype torch.float32, shape \(4,\)\)"):
        with node_rows(torch.zeros(4), epoch=0):
            pass


def _reference_salt(seed: int, epoch: int) -> int:
    """The salt with Python's unbounded ints (an independent statement of the mixing formula)."""
    x = (seed * 0x9E3779B1 + epoch * 0x85EBCA77) % 2**32
    for _ in range(2):
        x = ((x >> 16) ^ x) * 0x45D9F3B % 2**32
    return (x >> 16) ^ x


@pytest.mark.parametrize("seed", [0, 1, 7, 2**31 - 1, 2**32 + 5, 2**62 + 12345, -1, -(2**40) - 3])
def test_a_seed_tensor_gives_the_masks_of_the_int_seed(seed):
    """The seed buffer is hashed on its device (no host read); int64 products must not overflow: large and negative
    seeds give the masks of Python's exact integer arithmetic."""
    from lightning_gnnpipe.nn.dropout import _salt

    for epoch in (0, 3, 10**6):
        assert int(_salt(torch.tensor(seed), epoch)) == _salt(seed, epoch) == _reference_salt(seed, epoch)
    ids = torch.arange(300)
    assert torch.equal(node_mask(ids, 16, 0.4, torch.tensor(seed), 2), node_mask(ids, 16, 0.4, seed, 2))


def test_node_dropout_reads_nothing_back_from_its_tensors(monkeypatch):
    """A forward under ``node_rows`` never converts a tensor to a Python number (a host sync per call on CUDA)."""
    drop, x = NodeDropout(0.5, seed=3).train(), torch.ones(50, 4)
    with node_rows(torch.arange(50), epoch=1):
        expected = drop(x)

    def refuse(self, *args, **kwargs):
        raise AssertionError("a tensor was read on the host")

    for name in ("__int__", "__index__", "__float__", "__bool__", "item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    with node_rows(torch.arange(50), epoch=1):
        got = drop(x)
    monkeypatch.undo()
    assert torch.equal(got, expected)
    with pytest.raises(AssertionError, match="read on the host"):  # the spy does see a host read
        monkeypatch.setattr(torch.Tensor, "__int__", refuse)
        int(drop.seed)


@pytest.mark.parametrize("dropout,model_name", [("node", "dropconv"), ("plain", "dropconv"), ("node", "gcnii")])
def test_chunked_training_forward_equals_full_graph_with_the_same_masks(cora, dropout, model_name):
    """Within one epoch at fixed weights, L passes make every table row current: with NodeDropout the chunked
    training forward (halo rows included) then equals the full-graph forward under the same masks; with plain
    dropout, whose masks are drawn per chunk and per pass, it does not. Both models start with a node-wise block
    (an input Linear after dropout) and GCNII carries x0 through the stages."""
    torch.manual_seed(0)
    if model_name == "gcnii":
        model = GCNII(cora.num_features, 32, 7, num_layers=3, node_dropout=True).train()
    else:
        make = (lambda: NodeDropout(0.5)) if dropout == "node" else (lambda: nn.Dropout(0.5))
        model = BlockStack([NodeWise(nn.Sequential(make(), nn.Linear(cora.num_features, 32))),
                            DropConv(32, 32, make()), DropConv(32, 32, make()), DropConv(32, 7, make())]).train()
    with node_rows(torch.arange(cora.num_nodes), epoch=4):
        exact = model(cora.x, cora.edge_index)
    plan, stages = make_stages(model, cora, num_chunks=8, num_stages=2)
    for stage in stages:
        stage.next_epoch(4)
    with torch.no_grad():
        for _ in range(4):  # pass p makes the tables of layers <= p current
            out = chunked_forward(plan, stages, cora.x)
    if dropout == "node":
        torch.testing.assert_close(out, exact.detach(), atol=1e-5, rtol=1e-5)
        # An exact refresh in training mode draws the epoch's masks too: one pass after it is already exact.
        plan, stages = make_stages(model, cora, num_chunks=8, num_stages=2)
        h = (cora.x,)
        for stage in stages:
            stage.next_epoch(4)
            h = stage.forward_full(*h, write_history=True)
            h = h if isinstance(h, tuple) else (h,)
        torch.testing.assert_close(h[0], exact.detach(), atol=1e-5, rtol=1e-5)
        with torch.no_grad():
            torch.testing.assert_close(chunked_forward(plan, stages, cora.x), exact.detach(), atol=1e-5, rtol=1e-5)
    else:
        assert float((out - exact).abs().max()) > 0.1


class NodeDropoutModule(GNNModule):
    """Single-device training declares every row's node id, so its masks are the ones the parts draw."""

    def training_step(self, batch, batch_idx):
        with node_rows(torch.arange(batch.num_nodes), self.current_epoch):
            return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("mode", ["graph-parallel", "pipeline-one-chunk", "hybrid-one-slot"])
def test_node_dropout_training_equals_single_device(tmp_path, mode):
    """With NodeDropout (p = 0.5), training with the strategies equals single-device training with the same masks:
    graph parallelism exchanges current halo rows every layer and each part drops them as their owner does; a
    2-stage pipeline with one chunk (no halo) keys the masks by the trainer's epoch, as single-device training;
    2 stages x 2 partitions with one chunk per partition (one slot: every halo row arrives live) do both."""
    graph = sbm_graph(num_nodes=400)
    chunks, parts, devices, strategy = {
        "graph-parallel": (2, 1, 2, GraphParallelStrategy()),
        "pipeline-one-chunk": (1, 1, 2, GNNPipeStrategy()),
        "hybrid-one-slot": (2, 2, 4, GNNPipeStrategy(graph_parallel_size=2)),
    }[mode]

    def module():
        torch.manual_seed(0)
        return NodeDropoutModule(BlockStack([DropConv(16, 32, NodeDropout(0.5)), DropConv(32, 32, NodeDropout(0.5)),
                                             DropConv(32, 4, NodeDropout(0.5))]))

    single = fit(str(tmp_path / "single"), module(), GraphChunkDataModule(graph, num_chunks=1), devices=1)
    dm = GraphChunkDataModule(graph, num_chunks=chunks, num_parts=parts)
    parts = fit(str(tmp_path / "parts"), module(), dm, devices=devices, strategy=strategy)
    torch.testing.assert_close(losses(parts[0]), losses(single[0]), atol=1e-5, rtol=0)
    assert len(set(losses(single[0]))) == 5  # 5 epochs, 5 different masks and weights
