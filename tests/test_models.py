"""Model coverage: PyG BasicGNNs, PNA, norms, dropout, jumping knowledge, residual blocks.

Single-process: the stages stacked give the unsplit model's output, exactly (``forward_full``)
and chunk by chunk after an exact history refresh (``forward``). Multi-process: a short fit
equals the single-process chunked reference (or, with dropout, trains).
"""

import math

import pytest
import torch
from torch_geometric.nn.models import GAT, GCN, GIN, PNA, GraphSAGE
from torch_geometric.utils import degree

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, find_layer_stack
from lightning_gnnpipe.nn.feature_norm import check_feature_norms
from lightning_gnnpipe.strategy.checks import check_layout
from tests.helpers import GNNModule, ResGCN, fit, losses, one_thread, sbm_graph  # noqa: F401 (fixture)
from tests.reference import chunked_reference
from tests.test_stage import make_stages, refreshed_chunked_forward

F_IN, C = 16, 4


def pna(data, hidden=16, num_layers=3):
    deg = torch.bincount(degree(data.edge_index[1], data.num_nodes, dtype=torch.long))
    return PNA(F_IN, hidden, num_layers, C, aggregators=["mean", "min", "max", "std"],
               scalers=["identity", "amplification", "attenuation", "linear"], deg=deg)


ZOO = {
    "gcn": lambda d: GCN(F_IN, 32, 4, C),
    "sage": lambda d: GraphSAGE(F_IN, 32, 3, C),
    "gat": lambda d: GAT(F_IN, 16, 3, C, heads=2),
    "gin": lambda d: GIN(F_IN, 32, 3, C),
    "gcn_dropout": lambda d: GCN(F_IN, 32, 4, C, dropout=0.5),
    "sage_batchnorm": lambda d: GraphSAGE(F_IN, 32, 3, C, norm="batch_norm"),
    "gin_layernorm": lambda d: GIN(F_IN, 32, 3, C, norm="layer_norm", norm_kwargs={"mode": "node"}),
    "gat_concat4": lambda d: GAT(F_IN, 32, 3, C, heads=4),  # 4 heads of 8 channels, concatenated
    "gatv2": lambda d: GAT(F_IN, 16, 3, C, heads=2, v2=True),
    "pna": pna,
    "gcn_jk_last": lambda d: GCN(F_IN, 32, 3, C, jk="last", norm="layer_norm", norm_kwargs={"mode": "node"}),
    "resgcn": lambda d: ResGCN(F_IN, 32, 4, C, dropout=0.3),
}


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=400, num_classes=C, num_features=F_IN)


def _model(name, data):
    torch.manual_seed(0)
    gnn = ZOO[name](data)
    if name == "sage_batchnorm":  # give the running statistics real values first
        with torch.no_grad():
            gnn.train()(data.x, data.edge_index)
    return gnn.eval()


@pytest.mark.parametrize("name", sorted(ZOO))
def test_exact_forward_equals_unsplit(graph, name):
    gnn = _model(name, graph)
    _, stages = make_stages(gnn, graph, num_chunks=6, num_stages=3)
    h = graph.x
    for stage in stages:
        h = stage.forward_full(h)
    torch.testing.assert_close(h, gnn(graph.x, graph.edge_index), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_chunked_forward_after_refresh_equals_unsplit(graph, name):
    gnn = _model(name, graph)
    plan, stages = make_stages(gnn, graph, num_chunks=6, num_stages=2)
    out = refreshed_chunked_forward(plan, stages, graph.x)
    torch.testing.assert_close(out, gnn(graph.x, graph.edge_index), atol=1e-5, rtol=1e-5)


def test_jk_last_adds_a_node_wise_head_block():
    gnn = GCN(F_IN, 32, 3, C, jk="last")
    blocks = find_layer_stack(gnn).blocks
    assert len(blocks) == 4 and blocks[-1].module is gnn.lin


@pytest.mark.parametrize("jk", ["cat", "max", "lstm"])
def test_jumping_knowledge_over_all_layers_is_refused(jk):
    with pytest.raises(ValueError, match=rf"jk='{jk}'.*Use jk=None or jk='last'"):
        find_layer_stack(GCN(F_IN, 32, 3, C, jk=jk))


def test_batchnorm_warns_statistics_per_chunk():
    blocks = find_layer_stack(GraphSAGE(F_IN, 32, 3, C, norm="batch_norm")).blocks
    with pytest.warns(UserWarning, match=r"layer 0 holds BatchNorm; in training its statistics are computed per "
                                         r"chunk") as record:
        check_feature_norms(blocks)
    assert len(record) == 1  # once, not once per layer


@pytest.mark.parametrize("kwargs,name", [
    (dict(norm="layer_norm"), r"LayerNorm\(mode='graph'\)"),
    (dict(norm="graph_norm"), "GraphNorm"),
    (dict(norm="pair_norm"), "PairNorm"),
    (dict(norm="instance_norm"), "InstanceNorm"),
])
def test_graph_wide_norms_are_refused(kwargs, name):
    blocks = find_layer_stack(GCN(F_IN, 32, 3, C, **kwargs)).blocks
    with pytest.raises(ValueError, match=rf"layer 0 holds {name}, which normalises over all the rows"):
        check_feature_norms(blocks)


def test_strategy_checks_run_the_norm_checks(graph):
    dm = GraphChunkDataModule(graph, num_chunks=2)
    with pytest.warns(UserWarning, match="statistics are computed per chunk"):
        check_layout(GNNModule(GraphSAGE(F_IN, 32, 3, C, norm="batch_norm")), dm, 2, "gpipe")
    with pytest.raises(ValueError, match=r"holds LayerNorm\(mode='graph'\)"):
        check_layout(GNNModule(GCN(F_IN, 32, 3, C, norm="layer_norm")), dm, 2, "gpipe")


# Fit: the pipelined training equals the single-process chunked reference (no dropout), or trains
# (dropout). GAT also uses the time-balanced split, which must not change any number.
FITS = {
    "gat_concat4": (lambda d: GAT(F_IN, 32, 3, C, heads=4), dict(balance="time")),
    "pna": (pna, {}),
    "sage": (lambda d: GraphSAGE(F_IN, 32, 3, C), {}),
    "gin": (lambda d: GIN(F_IN, 32, 3, C), {}),
    "resgcn_dropout": (lambda d: ResGCN(F_IN, 32, 4, C, dropout=0.3), {}),
}


@pytest.mark.parametrize("name", sorted(FITS))
def test_fit_two_processes(tmp_path, graph, name):
    build, strategy_kwargs = FITS[name]
    epochs = 3
    dm = GraphChunkDataModule(graph, num_chunks=4)
    torch.manual_seed(0)
    module = GNNModule(build(graph), lr=0.01)
    ref_module = GNNModule(build(graph), lr=0.01)
    ref_module.load_state_dict(module.state_dict())
    ranks = fit(str(tmp_path), module, dm, devices=2, strategy=GNNPipeStrategy(**strategy_kwargs), epochs=epochs,
                limit_val_batches=0)
    got = losses(ranks[-1])
    assert len(got) == epochs and all(math.isfinite(v) for v in got)
    assert losses(ranks[0]) == got
    if "dropout" in name:
        assert got[-1] < got[0]
    else:
        ref = chunked_reference(ref_module, graph, dm.plan, epochs, layers=find_layer_stack(ref_module).blocks)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
