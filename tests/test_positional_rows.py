"""A stage's exact forward reading each chunk's local rows in place (PositionalRows) computes what the gathered
local rows compute, bit for bit, and what the unsplit model computes."""

import pytest
import torch
from torch import nn
from torch_geometric.nn import DeepGCNLayer, LayerNorm, SAGEConv
from torch_geometric.nn.models import GCN, GIN, GraphSAGE

from lightning_gnnpipe.data.adjacency import build_adjacency
from lightning_gnnpipe.nn.chunk_call import ChunkCaller
from lightning_gnnpipe.nn.gcnii import GCNII
from lightning_gnnpipe.nn.positional_rows import PositionalRows, reads_block_input
from lightning_gnnpipe.nn.sparse import sparse_aggregation
from tests.test_stage import make_stages


class DeepSage(nn.Module):
    """PyG's DeepGCNLayer stack (``block`` as given) between two linear layers."""

    def __init__(self, f, hidden, c, block, layers=3):
        super().__init__()
        self.lin_in, self.lin_out = nn.Linear(f, hidden), nn.Linear(hidden, c)
        self.layers = nn.ModuleList([DeepGCNLayer(SAGEConv(hidden, hidden), LayerNorm(hidden, mode="node"),
                                                  nn.ReLU(), block=block) for _ in range(layers)])

    def pipeline_blocks(self):
        from lightning_gnnpipe.nn.stack import NodeWise
        return [NodeWise(self.lin_in)] + list(self.layers) + [NodeWise(self.lin_out)]

    def forward(self, x, edge_index):
        x = self.lin_in(x)
        for layer in self.layers:
            x = layer(x, edge_index)
        return self.lin_out(x)


MODELS = {
    "gcn": lambda f, c: GCN(f, 32, 3, c),  # layer 0 multiplies first (1433 -> 32): its rows are gathered
    "sage": lambda f, c: GraphSAGE(f, 32, 3, c),
    "sage_project": lambda f, c: GraphSAGE(f, 32, 3, c, project=True),  # transforms the local rows first
    "gin": lambda f, c: GIN(f, 32, 3, c),
    "gcnii": lambda f, c: GCNII(f, 32, c, num_layers=5),
    "deep_res": lambda f, c: DeepSage(f, 32, c, "res"),
    "deep_res_plus": lambda f, c: DeepSage(f, 32, c, "res+"),  # norm and act once a row, then the conv in place
}


def _forward_full(stages, x):
    out = (x,)
    for stage in stages:
        out = stage.forward_full(*out)
        out = out if isinstance(out, tuple) else (out,)
    return out[0]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_in_place_exact_forward_equals_the_gathered_one_bit_for_bit(cora, name, monkeypatch):
    torch.manual_seed(0)
    model = MODELS[name](cora.num_features, 7).eval()
    _, stages = make_stages(model, cora, num_chunks=4, num_stages=2, sparse=True)
    calls = []
    matmul = PositionalRows.matmul
    monkeypatch.setattr(PositionalRows, "matmul", lambda self, op: calls.append(1) or matmul(self, op))
    with torch.no_grad():
        in_place = _forward_full(stages, cora.x)
        assert bool(calls) == (name != "sage_project"), calls  # projecting SAGE transforms its gathered rows first
        monkeypatch.setattr(ChunkCaller, "reads_in_place", lambda self, device: False)
        monkeypatch.setattr(ChunkCaller, "conv_input", lambda self, device: None)
        gathered = _forward_full(stages, cora.x)
        expected = model(cora.x, cora.edge_index)
    assert torch.equal(in_place, gathered)
    torch.testing.assert_close(in_place, expected, atol=1e-5, rtol=1e-5)


def test_only_blocks_whose_convs_read_their_input_unchanged_qualify():
    deep = lambda block: DeepGCNLayer(SAGEConv(8, 8), LayerNorm(8, mode="node"), nn.ReLU(), block=block)  # noqa
    assert reads_block_input(deep("res")) and not reads_block_input(deep("res+"))
    gcnii = GCNII(8, 8, 2, num_layers=1, dropout=0.5).blocks[1]
    assert not reads_block_input(gcnii.train()) and reads_block_input(gcnii.eval())
    assert not reads_block_input(nn.Linear(8, 8))
    edge_index = torch.tensor([[1, 2], [0, 0]])
    adjacency = build_adjacency(edge_index, 1, 3)
    rows = PositionalRows(torch.zeros(3, 8), 0, torch.arange(3), 1, {})
    with pytest.raises(ValueError, match="res\\+|reads_block_input"):
        with sparse_aggregation(deep("res+").eval(), edge_index, adjacency, positional=rows):
            pass


def test_a_forward_pre_hook_keeps_the_gathered_rows(cora):
    """A pre-hook may hand a conv another input than the block's (here a copy, at every conv), which only gathered
    local rows can serve: the block then gathers and computes what the model computes."""
    torch.manual_seed(0)
    model = GraphSAGE(cora.num_features, 32, 3, 7).eval()
    handle = model.convs[1].register_forward_pre_hook(lambda m, args: (args[0] * 1.0,) + tuple(args[1:]))
    _, stages = make_stages(model, cora, num_chunks=4, num_stages=2, sparse=True)
    assert [c.reads_in_place(torch.device("cpu")) for s in stages for c in s.runner.callers] == [True, False, True]
    with torch.no_grad():
        torch.testing.assert_close(_forward_full(stages, cora.x), model(cora.x, cora.edge_index), atol=1e-5,
                                   rtol=1e-5)
    handle.remove()
    glob = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, args: None)
    try:
        assert not any(c.reads_in_place(torch.device("cpu")) for s in stages for c in s.runner.callers)
    finally:
        glob.remove()


def test_the_positional_product_refuses_to_record_a_gradient():
    edge_index = torch.tensor([[1, 2], [0, 0]])
    op = build_adjacency(edge_index, 1, 3).operator()
    source = torch.arange(12.0).view(4, 3)  # local rows 0, 1, 2 are rows 1, 3, 0 of `source`
    rows = PositionalRows(source, 1, torch.tensor([1, 3, 0]), 1, {})
    torch.testing.assert_close(rows.matmul(op), (source[3] + source[0]).view(1, 3))
    with pytest.raises(RuntimeError, match="no_grad"):
        PositionalRows(source.requires_grad_(), 1, torch.tensor([1, 3, 0]), 1, {}).matmul(op)


def test_res_plus_normalises_each_row_once_a_layer_and_not_while_training(cora):
    """A "res+" DeepGCNLayer's norm and activation run once on the layer's |V| rows in an exact forward (each chunk
    would run them on its halo rows again); with dropout on in training the block keeps its own forward."""
    from lightning_gnnpipe.nn.inner_rows import conv_input

    torch.manual_seed(0)
    model = DeepSage(cora.num_features, 32, 7, "res+").eval()
    _, stages = make_stages(model, cora, num_chunks=4, num_stages=2, sparse=True)
    rows = []
    for layer in model.layers:
        layer.norm.register_forward_hook(lambda m, i, o: rows.append(i[0].size(0)))
    with torch.no_grad():
        out = _forward_full(stages, cora.x)
    assert rows == [cora.num_nodes] * len(model.layers)
    torch.testing.assert_close(out, model(cora.x, cora.edge_index), atol=1e-5, rtol=1e-5)
    layer = DeepGCNLayer(SAGEConv(8, 8), LayerNorm(8, mode="node"), nn.ReLU(), block="res+", dropout=0.5)
    assert conv_input(layer.train()) is None and conv_input(layer.eval()) is not None
    assert conv_input(DeepGCNLayer(SAGEConv(8, 8), LayerNorm(8, mode="node"), nn.ReLU(), block="res")) is None
