"""Sparse (CSR) aggregation: the same inner-row outputs and gradients as the edge-list path, conv by conv."""

from __future__ import annotations

from typing import Dict, List, Optional

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.testing import assert_close
from torch_geometric.nn import (GAT, GCN, GIN, DeepGCNLayer, EdgeConv, GATConv, GATv2Conv, GCN2Conv, GCNConv, GINConv,
                                GINEConv, GraphConv, GraphSAGE, PNAConv, SAGEConv)
from torch_geometric.utils import add_self_loops

from lightning_gnnpipe import build_chunk_plan
from lightning_gnnpipe.data.adjacency import build_adjacency, build_chunk_adjacency, to_adj_t
from lightning_gnnpipe.nn.dropout import NodeDropout, node_rows
from lightning_gnnpipe.nn.gcnii import GCNIILayer
from lightning_gnnpipe.nn.gcn_norm import full_graph_norm, norm_key, normalized_convs, precomputed_norm
from lightning_gnnpipe.nn.sparse import rectangular_output, sparse_aggregation, sparse_capable
from lightning_gnnpipe.nn.stack import BasicGNNLayer, call_block

N, D = 300, 16
TOL = dict(atol=1e-5, rtol=1e-5)
KEYS = [(False, True), (True, True), (False, False)]  # (improved, add_self_loops)


class Chunk:
    """One chunk of the test graph: local edges, full-graph-normalised local edges, their adjacencies."""

    def __init__(self, plan, c: int, raw, norm: Dict) -> None:
        self.c = c
        self.nodes, self.halo = plan.nodes[c], plan.halo[c]
        self.n_inner = self.nodes.numel()
        self.n_local = self.n_inner + self.halo.numel()
        self.rows = torch.cat([self.nodes, self.halo])
        self.edge_index = raw
        self.norm_edges = norm
        self.adjacency, self.norm_adjacency = build_chunk_adjacency(raw, self.n_inner, self.n_local, norm)


@pytest.fixture(scope="module")
def chunks() -> List[Chunk]:
    g = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, N, (2, 6 * N), generator=g)
    near = (src + torch.randint(-8, 9, (6 * N,), generator=g)) % N  # locality: METIS finds real chunks
    src = torch.where(torch.rand(6 * N, generator=g) < 0.8, near, src)
    dup = torch.randint(0, 6 * N, (40,), generator=g)  # multi-edges and self loops, as real edge lists have
    loops = torch.randint(0, N, (10,), generator=g)
    edge_index = torch.stack([torch.cat([src, src[dup], loops]), torch.cat([dst, dst[dup], loops])])
    plan = build_chunk_plan(edge_index, N, 3)
    raw = plan.local_edges(edge_index)
    norm = [dict() for _ in range(3)]
    for key in KEYS:
        ei_n, ew_n = full_graph_norm(edge_index, N, key, torch.float32)
        for c, (local, eid) in enumerate(plan.local_edges(ei_n)):
            norm[c][key] = (local, ew_n[eid])
    out = [Chunk(plan, c, raw[c][0], norm[c]) for c in range(3)]
    assert all(ch.halo.numel() > 0 for ch in out)
    return out


def _loss_and_grads(block: nn.Module, out: Tensor, inputs: List[Tensor], weight: Tensor):
    params = [p for p in block.parameters() if p.requires_grad]
    grads = torch.autograd.grad((out * weight).sum(), inputs + params, allow_unused=True)
    return grads


def _edge_list(block, ch: Chunk, x, x0, epoch: int = 0):
    convs = normalized_convs(block)
    edges = {norm_key(c): ch.norm_edges[norm_key(c)] for c in convs}
    with precomputed_norm(convs, edges), node_rows(ch.rows, epoch):
        return call_block(block, x, ch.edge_index, x0)[: ch.n_inner]


def _sparse(block, ch: Chunk, x, x0, epoch: int = 0, **kwargs):
    with sparse_aggregation(block, ch.edge_index, ch.adjacency, ch.norm_adjacency, **kwargs) as call, \
            node_rows(ch.rows[: call.out_rows], epoch):
        out = call_block(block, x, ch.edge_index, x0)
    assert out.size(0) == call.out_rows
    return out[: ch.n_inner], call


def check(block: nn.Module, chunks: List[Chunk], width: int = D, rectangular: Optional[bool] = None,
          extra: Optional[List[Tensor]] = None, dtype: torch.dtype = torch.float32, **kwargs):
    """Sparse path == edge-list path on every chunk: inner outputs, gradients to inputs and parameters."""
    assert sparse_capable(block)
    for ch in chunks:
        torch.manual_seed(ch.c)
        x = torch.randn(ch.n_local, width, dtype=dtype, requires_grad=True)
        takes_x0 = getattr(block, "takes_x0", False)
        x0 = torch.randn(ch.n_local, width, dtype=dtype, requires_grad=True) if takes_x0 else None
        inputs = [x] + ([x0] if x0 is not None else []) + list(extra or [])
        ref = _edge_list(block, ch, x, x0)
        weight = torch.randn_like(ref)
        ref_grads = _loss_and_grads(block, ref, inputs, weight)
        out, call = _sparse(block, ch, x, x0, **kwargs)
        if rectangular is not None:
            assert call.rectangular is rectangular
            assert call.out_rows == (ch.n_inner if rectangular else ch.n_local)
        assert_close(out, ref, **TOL)
        for got, want in zip(_loss_and_grads(block, out, inputs, weight), ref_grads):
            if want is None:
                assert got is None or torch.count_nonzero(got) == 0
            else:
                assert_close(got, want, **TOL)
    for m in block.modules():  # forwards restored
        assert "forward" not in m.__dict__


class X0Block(nn.Module):
    """A GCN2Conv block called ``(x, edge_index, x0)``."""

    takes_x0 = True

    def __init__(self, conv: GCN2Conv) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x, edge_index, x0):
        return F.relu(self.conv(x, x0, edge_index))


class Residual(nn.Module):
    """A user's residual block: ``x + conv(dropout(relu(norm(x))))`` (needs square outputs)."""

    def __init__(self, conv: nn.Module, p: float = 0.0) -> None:
        super().__init__()
        self.norm, self.drop, self.conv = nn.LayerNorm(D), NodeDropout(p, seed=3), conv

    def forward(self, x, edge_index):
        return x + self.conv(self.drop(F.relu(self.norm(x))), edge_index)


def _gin_conv(aggr: str = "add") -> GINConv:
    conv = GINConv(nn.Sequential(nn.Linear(D, 32), nn.ReLU(), nn.Linear(32, 8)), train_eps=True, aggr=aggr)
    with torch.no_grad():
        conv.eps.fill_(0.3)
    return conv


CONVS = {
    "gcn": lambda: GCNConv(D, 8),
    "gcn_wide": lambda: GCNConv(D, 40),  # d_in < d_out: aggregates before the linear layer
    "gcn_improved": lambda: GCNConv(D, 8, improved=True),
    "gcn_no_loops": lambda: GCNConv(D, 8, add_self_loops=False),
    "gcn_raw": lambda: GCNConv(D, 8, normalize=False),
    "gcn_raw_mean": lambda: GCNConv(D, 8, normalize=False, aggr="mean"),
    "sage_mean": lambda: SAGEConv(D, 8),
    "sage_sum": lambda: SAGEConv(D, 8, aggr="sum"),
    "sage_add_no_root": lambda: SAGEConv(D, 8, aggr="add", root_weight=False),
    "sage_mean_no_root": lambda: SAGEConv(D, 8, root_weight=False),
    "sage_project_normalize": lambda: SAGEConv(D, 8, project=True, normalize=True),
    "gin": lambda: _gin_conv(),
    "gin_mean": lambda: _gin_conv("mean"),
    "graph_add": lambda: GraphConv(D, 8),
    "graph_mean": lambda: GraphConv(D, 8, aggr="mean"),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_conv_block_matches_edge_list(chunks, name):
    torch.manual_seed(1)
    check(CONVS[name](), chunks, rectangular=False)  # a bare conv is a user block: square


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("normalize", [True, False])
def test_gcn2_matches_edge_list(chunks, shared, normalize):
    torch.manual_seed(2)
    check(X0Block(GCN2Conv(D, alpha=0.2, theta=0.5, layer=2, shared_weights=shared, normalize=normalize)), chunks,
          rectangular=False)


SQUARE_CONVS = {  # D -> D, for residual blocks
    "gcn": lambda: GCNConv(D, D),
    "gcn_raw": lambda: GCNConv(D, D, normalize=False),
    "sage_mean": lambda: SAGEConv(D, D),
    "sage_sum": lambda: SAGEConv(D, D, aggr="sum"),
    "gin": lambda: GINConv(nn.Linear(D, D)),
    "graph_mean": lambda: GraphConv(D, D, aggr="mean"),
}


@pytest.mark.parametrize("name", sorted(SQUARE_CONVS))
def test_residual_block_is_square_and_matches(chunks, name):
    torch.manual_seed(3)
    check(Residual(SQUARE_CONVS[name](), p=0.4), chunks, rectangular=False)  # NodeDropout keyed by n_local rows


@pytest.mark.parametrize("block", ["res+", "res", "dense", "plain"])
@pytest.mark.parametrize("conv", ["sage_mean", "gcn"])
def test_deep_gcn_layer_is_rectangular_and_matches(chunks, block, conv):
    torch.manual_seed(9)
    layer = DeepGCNLayer(SQUARE_CONVS[conv](), nn.LayerNorm(D), nn.ReLU(), block=block)
    assert rectangular_output(layer)
    check(layer, chunks, rectangular=True)  # the residual adds the input's inner rows (its forward swapped, restored)
    layer.dropout = 0.3
    check(layer.eval(), chunks, rectangular=True)


def test_deep_gcn_layer_square_when_checkpointing_or_its_input_rows_matter(chunks):
    torch.manual_seed(10)
    layer = DeepGCNLayer(SAGEConv(D, D), nn.LayerNorm(D), nn.ReLU(), block="res+", ckpt_grad=True)
    assert not rectangular_output(layer)  # its checkpoint reruns the conv after the sparse forward is restored
    layer.eval()
    with torch.no_grad():  # (checkpoint's reentrant backward refuses autograd.grad: compare outputs only)
        for ch in chunks:
            x = torch.randn(ch.n_local, D)
            out, call = _sparse(layer, ch, x, None)
            assert call.rectangular
            assert_close(out, _edge_list(layer, ch, x, None), **TOL)
    layer = DeepGCNLayer(SAGEConv(D, D), nn.BatchNorm1d(D), nn.ReLU(), block="res+")
    check(layer, chunks, rectangular=False)
    act = nn.Sequential(nn.ReLU(), NodeDropout(0.3, seed=5))  # on the input's local rows, keyed by their ids
    check(DeepGCNLayer(SAGEConv(D, D), nn.LayerNorm(D), act, block="res+"), chunks, rectangular=False)
    check(DeepGCNLayer(SAGEConv(D, D), nn.LayerNorm(D), act, block="res"), chunks, rectangular=True)  # on its output


BASIC = {
    "gcn": lambda **kw: GCN(D, 24, num_layers=3, out_channels=8, **kw),
    "sage": lambda **kw: GraphSAGE(D, 24, num_layers=3, out_channels=8, **kw),
    "sage_sum": lambda **kw: GraphSAGE(D, 24, num_layers=3, out_channels=8, aggr="sum", **kw),
    "gin": lambda **kw: GIN(D, 24, num_layers=3, out_channels=8, **kw),
}


def _layers(gnn) -> List[BasicGNNLayer]:
    return [BasicGNNLayer(gnn, i) for i in range(gnn.num_layers)]


@pytest.mark.parametrize("name", sorted(BASIC))
def test_basic_gnn_layers_are_rectangular_and_match(chunks, name):
    torch.manual_seed(4)
    gnn = BASIC[name]()
    for layer, width in zip(_layers(gnn), [D, 24, 24]):
        assert rectangular_output(layer)
        check(layer, chunks, width=width, rectangular=True)


def test_basic_gnn_layer_forced_square_matches(chunks):
    torch.manual_seed(5)
    layer = BasicGNNLayer(GraphSAGE(D, 24, num_layers=2), 0)
    check(layer, chunks, rectangular=False, allow_rectangular=False)


@pytest.mark.parametrize("norm,kwargs,train_rect,eval_rect", [
    ("batch_norm", None, False, True),        # training statistics over all rows: square, as the edge-list path
    ("layer_norm", {"mode": "node"}, True, True),
    ("layer_norm", None, False, False),       # mode="graph": normalises over all rows it sees
])
def test_basic_gnn_norms(chunks, norm, kwargs, train_rect, eval_rect):
    torch.manual_seed(6)
    gnn = GCN(D, 24, num_layers=2, norm=norm, norm_kwargs=kwargs)
    if norm == "batch_norm":
        with torch.no_grad():
            gnn.norms[0].module.running_mean.uniform_(-0.5, 0.5)
            gnn.norms[0].module.running_var.uniform_(0.5, 2.0)
    layer = BasicGNNLayer(gnn, 0).double()  # float64: under BatchNorm the conv bias's true gradient is 0, float32
    gnn.train()                             # leaves ~1e-5 of rounding noise in it on either path
    check(layer, chunks, rectangular=train_rect, dtype=torch.float64)
    gnn.eval()
    check(layer, chunks, rectangular=eval_rect, dtype=torch.float64)


@pytest.mark.parametrize("p,per_node,train,rect", [
    (0.0, False, True, True),
    (0.5, True, True, False),  # NodeDropout on the input's local rows: their ids must be declared, so square
    (0.5, True, False, True),
    (0.5, False, False, True),
])
def test_gcnii_layer_rectangular_unless_node_dropout_trains(chunks, p, per_node, train, rect):
    torch.manual_seed(8)
    layer = GCNIILayer(D, alpha=0.1, theta=0.5, layer=3, dropout=p, node_dropout=per_node).train(train)
    assert rectangular_output(layer) is rect
    check(layer, chunks, rectangular=rect)


def test_node_dropout_in_rectangular_layer_keys_inner_ids(chunks):
    torch.manual_seed(7)
    gnn = GraphSAGE(D, 24, num_layers=2)
    gnn.dropout = NodeDropout(0.5, seed=11)
    gnn.train()
    layer = BasicGNNLayer(gnn, 0)
    check(layer, chunks, rectangular=True)  # node_rows(rows[:n_inner]) in _sparse gives the edge-list masks
    ch = chunks[0]
    x = torch.randn(ch.n_local, D)
    with pytest.raises(ValueError, match="one row per node"):  # all n_local ids declared: refused, not mis-keyed
        with sparse_aggregation(layer, ch.edge_index, ch.adjacency) as call, node_rows(ch.rows, 0):
            assert call.rectangular
            layer(x, ch.edge_index)
    assert "forward" not in layer.conv.__dict__  # restored after an exception too


class Weighted(nn.Module):
    """A block that passes per-edge weights aligned with the chunk's edge_index."""

    def __init__(self, conv: nn.Module, weight: Tensor) -> None:
        super().__init__()
        self.conv, self.weight = conv, weight

    def forward(self, x, edge_index):
        return self.conv(x, edge_index, self.weight)


@pytest.mark.parametrize("conv", ["gcn_raw", "graph_add", "graph_mean"])
@pytest.mark.parametrize("learned", [False, True])
def test_edge_weights(chunks, conv, learned):
    torch.manual_seed(8)
    for ch in chunks:
        w = torch.rand(ch.edge_index.size(1), requires_grad=learned)  # learned: edge-list fallback
        block = Weighted(CONVS[conv](), w)
        check(block, [ch], rectangular=False, extra=[w] if learned else None)


def test_block_that_changes_edges_falls_back(chunks):
    class SelfLoops(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = SAGEConv(D, 8, aggr="sum")

        def forward(self, x, edge_index):
            return self.conv(x, add_self_loops(edge_index, num_nodes=x.size(0))[0])

    torch.manual_seed(9)
    check(SelfLoops(), chunks, rectangular=False)


def test_sparse_capable_is_conservative(chunks):
    class MyGCN(GCNConv):
        pass

    refused = [
        GATConv(D, 8), GATv2Conv(D, 8), GINEConv(nn.Linear(D, D), edge_dim=4), EdgeConv(nn.Linear(2 * D, D)),
        PNAConv(D, 8, aggregators=["mean", "max"], scalers=["identity"], deg=torch.tensor([0, 3, 5])),
        SAGEConv(D, 8, aggr="max"), SAGEConv(D, 8, aggr=["mean", "sum"]), GraphConv(D, 8, aggr="max"),
        GCNConv(D, 8, flow="target_to_source"), MyGCN(D, 8),
        BasicGNNLayer(GAT(D, 8, num_layers=2), 0), Residual(GATConv(D, D)),
        nn.Sequential(nn.Linear(D, D)),  # no message passing
    ]
    for block in refused:
        assert not sparse_capable(block), block
    mixed = nn.ModuleList([GCNConv(D, 8), GATConv(D, 8)])
    assert not sparse_capable(mixed)
    for make in CONVS.values():
        assert sparse_capable(make())
    ch = chunks[0]
    with pytest.raises(ValueError, match="not sparse-capable"):
        with sparse_aggregation(BasicGNNLayer(GAT(D, 8, num_layers=2), 0), ch.edge_index, ch.adjacency):
            pass


def test_missing_norm_adjacency_and_mismatch_raise(chunks):
    ch = chunks[0]
    with pytest.raises(ValueError, match=r"needs the full-graph normalised adjacency"):
        with sparse_aggregation(GCNConv(D, 8, improved=True), ch.edge_index, ch.adjacency, {}):
            pass
    with pytest.raises(ValueError, match="edges"):
        with sparse_aggregation(SAGEConv(D, 8), ch.edge_index[:, 1:], ch.adjacency):
            pass


def _dense_adj(edge_index: Tensor, n_inner: int, n_local: int, weight: Optional[Tensor] = None) -> Tensor:
    a = torch.zeros(n_inner, n_local, dtype=torch.float64)
    w = torch.ones(edge_index.size(1), dtype=torch.float64) if weight is None else weight.double()
    a.index_put_((edge_index[1], edge_index[0]), w, accumulate=True)  # multi-edges add up
    return a


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_adjacency_matches_dense(chunks, index_dtype):
    ch = chunks[1]
    w = torch.rand(ch.edge_index.size(1))
    dense = _dense_adj(ch.edge_index, ch.n_inner, ch.n_local, w)
    adj = build_adjacency(ch.edge_index, ch.n_inner, ch.n_local, w, index_dtype=index_dtype)
    assert adj.crow.dtype == adj.col.dtype == index_dtype
    op = adj.operator(torch.float64)
    assert op.adj_t.layout == torch.sparse_csr and op.adj_t.shape == (ch.n_inner, ch.n_local)
    assert op.adj.shape == (ch.n_local, ch.n_inner)
    assert_close(op.adj_t.to_dense(), dense)
    assert_close(op.adj.to_dense(), dense.t())
    square = op.square_adj_t()
    assert square.shape == (ch.n_local, ch.n_local)
    assert_close(square.to_dense()[: ch.n_inner], dense)
    assert torch.count_nonzero(square.to_dense()[ch.n_inner:]) == 0
    deg = torch.bincount(ch.edge_index[1], minlength=ch.n_inner)
    assert torch.equal(adj.degree().long(), deg)
    mean = adj.operator(torch.float64, mean=True).adj_t.to_dense()
    assert_close(mean, dense / deg.clamp(min=1).double()[:, None])
    assert adj.operator(torch.float32) is adj.operator(torch.float32)  # cached
    # fwd + bwd through the transpose, float32
    x = torch.randn(ch.n_local, 5, requires_grad=True)
    y = adj.operator(torch.float32).matmul(x)
    g = torch.randn_like(y)
    (gx,) = torch.autograd.grad((y * g).sum(), [x])
    assert_close(y.double(), dense @ x.detach().double(), **TOL)
    assert_close(gx.double(), dense.t() @ g.double(), **TOL)
    assert_close(to_adj_t(ch.edge_index, ch.n_inner, ch.n_local, w, torch.float64).to_dense(), dense)
    assert to_adj_t(ch.edge_index, ch.n_inner, ch.n_local, square=True).shape == (ch.n_local, ch.n_local)


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_deterministic_matmul_equals_the_csr_product(chunks, index_dtype):
    """The kernel taken on CUDA under ``torch.use_deterministic_algorithms(True)`` (run here on the CPU) equals the
    dense product, both ways (forward ``adj_t``, backward ``adj``), on rows with no entries too (halo rows of the
    transpose); the same inputs give the same bits."""
    from lightning_gnnpipe.data.adjacency import csr_matmul, deterministic_matmul

    ch = chunks[2]
    w = torch.rand(ch.edge_index.size(1))
    dense = _dense_adj(ch.edge_index, ch.n_inner, ch.n_local, w)
    op = build_adjacency(ch.edge_index, ch.n_inner, ch.n_local, w, index_dtype=index_dtype).operator(torch.float64)
    x, g = torch.randn(ch.n_local, 6, dtype=torch.float64), torch.randn(ch.n_inner, 6, dtype=torch.float64)
    assert_close(deterministic_matmul(op.adj_t, x), dense @ x)
    assert_close(deterministic_matmul(op.adj, g), dense.t() @ g)
    assert bool((dense.t().abs().sum(1) == 0).any())  # some rows of the transpose have no entry
    assert torch.equal(deterministic_matmul(op.adj_t, x), deterministic_matmul(op.adj_t, x))
    torch.use_deterministic_algorithms(True)
    try:
        assert torch.equal(csr_matmul(op.adj_t, x), op.adj_t @ x)  # on the CPU: the CSR kernel, also in that mode
    finally:
        torch.use_deterministic_algorithms(False)


def test_adjacency_errors(chunks):
    ch = chunks[0]
    with pytest.raises(ValueError, match="inner node"):
        build_adjacency(ch.edge_index.flip(0), ch.n_inner, ch.n_local)  # halo targets
    with pytest.raises(ValueError, match="shape"):
        build_adjacency(ch.edge_index[0], ch.n_inner, ch.n_local)
    with pytest.raises(ValueError, match="n_inner <= n_local"):
        build_adjacency(ch.edge_index, ch.n_local + 1, ch.n_local)
    with pytest.raises(ValueError, match="edge_weight"):
        build_adjacency(ch.edge_index, ch.n_inner, ch.n_local, torch.ones(3))
    op = ch.adjacency.operator(torch.float32)
    with pytest.raises(ValueError, match="expected x of shape"):
        op.matmul(torch.randn(ch.n_inner, 4))
    with pytest.raises(ValueError, match="dtype"):
        op.matmul(torch.randn(ch.n_local, 4, dtype=torch.float64))
    empty = build_adjacency(torch.empty(2, 0, dtype=torch.long), 4, 6)
    assert torch.count_nonzero(empty.operator().matmul(torch.randn(6, 3))) == 0


def test_compact_chunk_graph_computes_the_same_and_refuses_the_edge_list_path():
    """A compact chunk graph (PyG GCN layers: no edge lists, only the normalised sum operators) gives the outputs of
    the full one on the sparse path, keeps fewer bytes, and refuses the edge-list path (autocast) with an error
    instead of aggregating over its empty edge lists."""
    from lightning_gnnpipe import GraphChunkDataModule, find_layer_stack
    from lightning_gnnpipe.data.chunk_graph import build_chunk_graph
    from lightning_gnnpipe.nn.chunk_call import ChunkCaller, chunk_graph_options
    from lightning_gnnpipe.nn.gcn_norm import norm_keys
    from tests.helpers import GCNModule, sbm_graph

    data = sbm_graph(200)
    plan = GraphChunkDataModule(data, num_chunks=4).plan
    blocks = find_layer_stack(GCNModule(16, 8, 2, 4)).blocks
    options = chunk_graph_options(blocks)
    assert options["compact"]
    graphs = [build_chunk_graph(plan, data.edge_index, norm_keys(blocks), torch.device("cpu"),
                                **{**options, "compact": compact}) for compact in (False, True)]
    assert graphs[1].compacted and not graphs[0].compacted and graphs[1].nbytes() < 0.8 * graphs[0].nbytes()
    c = 1
    x_local = data.x[torch.cat([plan.nodes[c], plan.halo[c]])]
    rows = torch.cat([plan.nodes[c], plan.halo[c]])
    full, compact = (ChunkCaller(blocks[0], g)(x_local, c, rows, 0) for g in graphs)
    torch.testing.assert_close(compact, full, atol=0, rtol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(RuntimeError, match="built compact"):
        ChunkCaller(blocks[0], graphs[1])(x_local, c, rows, 0)
