"""The exact whole-graph forward of a runner that holds every chunk: a block of known code runs once per layer on
the chunks' operators side by side (``lightning_gnnpipe/nn/whole_graph.py``), and gives the unsplit model's output
on the whole graph, as the chunk-by-chunk forward does."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_geometric.nn import DeepGCNLayer, SAGEConv

from lightning_gnnpipe import GraphChunkDataModule, find_layer_stack
from lightning_gnnpipe.data.chunk_graph import build_chunk_graph
from lightning_gnnpipe.nn import chunk_runner as runner_module
from lightning_gnnpipe.nn.chunk_call import chunk_graph_options
from lightning_gnnpipe.nn.chunk_runner import ChunkRunner
from lightning_gnnpipe.nn.gcn_norm import norm_keys
from lightning_gnnpipe.nn.gcnii import GCNII
from lightning_gnnpipe.nn.stack import BlockStack, NodeWise, takes_x0
from lightning_gnnpipe.nn.whole_graph import WholeAdjacency
from tests.helpers import sbm_graph


def _res_sage(features: int, hidden: int, classes: int, layers: int) -> BlockStack:
    convs = [DeepGCNLayer(SAGEConv(hidden, hidden), nn.LayerNorm(hidden), nn.ReLU(), block="res+")
             for _ in range(layers)]
    return BlockStack([NodeWise(nn.Linear(features, hidden))] + convs + [NodeWise(nn.Linear(hidden, classes))])


MODELS = {"gcnii": lambda f, c: GCNII(f, 16, c, num_layers=4), "res_sage": lambda f, c: _res_sage(f, 16, c, 3)}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_whole_graph_forward_equals_the_unsplit_model_and_the_chunked_forward(name, monkeypatch):
    torch.manual_seed(0)
    data = sbm_graph(300)
    model = MODELS[name](data.num_features, 4).eval()
    blocks = find_layer_stack(model).blocks
    plan = GraphChunkDataModule(data, num_chunks=4).plan
    with torch.no_grad():
        expected = model(data.x, data.edge_index)  # PyG's message passing on the whole graph
    graph = build_chunk_graph(plan, data.edge_index, norm_keys(blocks), torch.device("cpu"),
                              **chunk_graph_options(blocks))
    calls = []
    original = WholeAdjacency.operator
    monkeypatch.setattr(WholeAdjacency, "operator", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    outs = {}
    for whole in (True, False):
        if not whole:
            monkeypatch.setattr(ChunkRunner, "_whole_graph_call", lambda self, j, h: False)
        runner = ChunkRunner(blocks, list(range(len(blocks))), graph, x=data.x,
                             carry_x0=any(takes_x0(b) for b in blocks))
        with torch.no_grad():
            outs[whole], _ = runner.run_full(data.x, None, epoch=0)
        if whole:
            assert len(calls) == len(blocks) - 2  # every message-passing block ran once on the whole graph
            assert runner._whole_graph is not None
    torch.testing.assert_close(outs[True], expected, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(outs[False], expected, atol=2e-5, rtol=1e-5)


def test_whole_adjacency_is_forward_only_and_the_stand_in_edges_refuse_message_passing():
    torch.manual_seed(0)
    data = sbm_graph(120)
    blocks = find_layer_stack(_res_sage(data.num_features, 8, 4, 1)).blocks
    plan = GraphChunkDataModule(data, num_chunks=3).plan
    graph = build_chunk_graph(plan, data.edge_index, norm_keys(blocks), torch.device("cpu"),
                              **chunk_graph_options(blocks))
    runner = ChunkRunner(blocks, list(range(len(blocks))), graph, x=data.x)
    edge_index, adjacency, _ = runner._whole()
    assert adjacency is not None and adjacency.num_edges == sum(int(e.size(1)) for e in graph.edge_index)
    with pytest.raises(RuntimeError, match="forward only"):
        adjacency.operator(torch.float32, mean=True)  # autograd on
    with torch.no_grad():
        op = adjacency.operator(torch.float32, mean=True)
        order, position, _, _ = runner._chunk_order()
        h = torch.randn(data.num_nodes, 8)
        dense = torch.zeros(data.num_nodes, data.num_nodes)  # mean over in-edges, multi-edges counted
        dense.index_put_((data.edge_index[1], data.edge_index[0]), torch.ones(data.edge_index.size(1)),
                         accumulate=True)
        dense = dense / dense.sum(1, keepdim=True).clamp(min=1)
        torch.testing.assert_close((op @ h[order])[position], dense @ h, atol=1e-5, rtol=1e-5)
        conv = SAGEConv(8, 8)
        from lightning_gnnpipe.nn.sparse import sparse_aggregation

        with sparse_aggregation(conv, edge_index, adjacency, {}, edge_list_fallback=False), \
                pytest.raises(RuntimeError, match="does not allow"):
            conv(h, edge_index, size=(data.num_nodes, data.num_nodes))  # not the block's plain call
