"""Partition, halos and chunk-local edges against brute force."""

import pytest
import torch

from lightning_gnnpipe import GraphChunkDataModule, build_chunk_plan, metis_partition
from tests.helpers import sbm_graph


def brute_force_halo(edge_index, part, c):
    return sorted({int(s) for s, d in edge_index.t().tolist() if part[d] == c and part[s] != c})


@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("num_chunks", [1, 3, 8])
def test_halo_equals_brute_force(directed, num_chunks):
    data = sbm_graph(num_nodes=200)
    ei = data.edge_index
    if directed:  # keep one direction of half the edges, add self-loops and a duplicate
        keep = torch.rand(ei.size(1), generator=torch.Generator().manual_seed(1)) < 0.6
        ei = torch.cat([ei[:, keep], torch.tensor([[0, 5, 5], [0, 5, 7]])], dim=1)
    plan = build_chunk_plan(ei, 200, num_chunks)
    for c in range(num_chunks):
        assert plan.halo[c].tolist() == brute_force_halo(ei, plan.part, c)
        assert plan.nodes[c].tolist() == sorted(int(v) for v in (plan.part == c).nonzero().view(-1))
    assert sorted(torch.cat(plan.nodes).tolist()) == list(range(200))


def test_every_edge_in_exactly_one_chunk(cora):
    plan = build_chunk_plan(cora.edge_index, cora.num_nodes, 8)
    parts = plan.local_edges(cora.edge_index)
    all_ids = torch.cat([eid for _, eid in parts])
    assert sorted(all_ids.tolist()) == list(range(cora.num_edges))
    for c, (local, eid) in enumerate(parts):
        # targets are inner nodes, and local ids map back to the same global edge
        assert bool((local[1] < plan.nodes[c].numel()).all())
        ids = torch.cat([plan.nodes[c], plan.halo[c]])
        assert torch.equal(ids[local], cora.edge_index[:, eid])


def test_metis_parts_are_balanced_and_nonempty(cora):
    part = metis_partition(cora.edge_index, cora.num_nodes, 8)
    sizes = torch.bincount(part, minlength=8)
    assert int(sizes.min()) > 0 and int(sizes.max()) <= 1.05 * cora.num_nodes / 8 + 1


def test_empty_parts_are_filled():
    # 6 isolated nodes and one edge: METIS may leave parts empty; every part must get a node.
    ei = torch.tensor([[0], [1]])
    part = metis_partition(ei, 6, 6)
    assert sorted(part.tolist()) == list(range(6))


def test_padding_layout():
    data = sbm_graph(num_nodes=90)
    plan = build_chunk_plan(data.edge_index, 90, 4)
    m = plan.max_chunk_size
    x_pad = plan.pad(data.x)
    assert x_pad.shape == (4 * m, data.num_features)
    for c, nodes in enumerate(plan.nodes):
        assert torch.equal(x_pad[c * m: c * m + nodes.numel()], data.x[nodes])
        assert bool((x_pad[c * m + nodes.numel(): (c + 1) * m] == 0).all())


def test_datamodule_yields_ordinary_full_graph():
    data = sbm_graph(num_nodes=100)
    dm = GraphChunkDataModule(data, num_chunks=4)
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader(), dm.predict_dataloader()):
        (batch,) = list(loader)
        assert batch is data


def _tensor_bytes(obj) -> int:
    """Bytes of every tensor an object holds in its attributes (lists and dicts followed), each counted once."""
    seen, total, todo = set(), 0, [obj]
    while todo:
        item = todo.pop()
        if isinstance(item, torch.Tensor):
            if item.data_ptr() not in seen:
                seen.add(item.data_ptr())
                total += item.numel() * item.element_size()
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
        elif isinstance(item, dict):
            todo.extend(item.values())
        elif hasattr(item, "__dict__"):
            todo.extend(vars(item).values())
    return total


def test_no_plan_structure_grows_with_chunks_times_nodes():
    """A plan holds the part of every node, every node once as an inner node and the halos: for K = 8 and K = 64 on
    one graph its tensor bytes differ by the halo growth alone (no per-chunk ``(|V|,)`` map is kept, also after
    ``local_edges``)."""
    data = sbm_graph(num_nodes=2000)
    sizes = {}
    for k in (8, 64):
        plan = build_chunk_plan(data.edge_index, 2000, k)
        plan.local_edges(data.edge_index)  # used to cache K maps of |V| ids
        halo = sum(h.numel() * h.element_size() for h in plan.halo)
        sizes[k] = (_tensor_bytes(plan), halo)
    assert sizes[64][0] - sizes[8][0] == sizes[64][1] - sizes[8][1]  # K maps of |V| ids would add 0.9 MB here


@pytest.mark.parametrize("num_nodes,num_edges", [(50, 300), (1000, 5000), (7, 0), (3, 5)])
def test_symmetric_csr_equals_to_undirected(num_nodes, num_edges):
    """METIS's input: the loop-free graph made undirected and deduplicated, as PyG's ``to_undirected`` makes it."""
    import numpy as np
    from torch_geometric.utils import to_undirected

    from lightning_gnnpipe.data.partition import symmetric_csr

    ei = torch.randint(num_nodes, (2, num_edges), generator=torch.Generator().manual_seed(num_nodes))
    ei = torch.cat([ei, ei[:, :3]], 1)  # duplicates too
    ref = to_undirected(ei[:, ei[0] != ei[1]], num_nodes=num_nodes)
    rowptr, col = symmetric_csr(ei, num_nodes)
    assert np.array_equal(rowptr, np.concatenate([[0], np.bincount(ref[0].numpy(), minlength=num_nodes).cumsum()]))
    assert np.array_equal(col, ref[1].numpy())


def test_device_graph_keeps_named_attributes_on_the_host():
    """The strategies keep the batch's edge list on the host (their stages hold chunk graphs); without a strategy the
    whole graph moves. ("meta" stands in for an accelerator.)"""
    graph = sbm_graph(num_nodes=100)
    dm = GraphChunkDataModule(graph, num_chunks=2)
    kept = dm.device_graph("meta", ("edge_index",))
    assert kept.edge_index is graph.edge_index and kept.x.device.type == "meta" and kept.y.device.type == "meta"
    assert dm.device_graph("meta", ("edge_index",)) is kept  # copied once, then reused
    assert graph.x.device.type == "cpu"  # the caller's Data is not moved
    whole = dm.device_graph("meta")
    assert whole.edge_index.device.type == "meta" and whole.x.device.type == "meta"


@pytest.mark.parametrize("alternating", [False, True])
def test_stale_read_stats_equal_a_simulated_epoch(alternating):
    """Fraction and mean age of the rows read historical, against a simulation: chunks run one per time step
    (``1 / K`` epoch each), in order, or reversed every odd epoch; a read of a row its chunk has not written this
    epoch is historical, and its age is the time since its chunk wrote it in the epoch before."""
    from lightning_gnnpipe.data.order import stale_read_stats

    graph = sbm_graph(num_nodes=120)
    plan = build_chunk_plan(graph.edge_index, graph.num_nodes, 4)
    k, src, dst = plan.num_chunks, plan.part[graph.edge_index[0]], plan.part[graph.edge_index[1]]
    for epoch in (1, 2):  # an odd epoch, then an even one
        orders = [list(range(k))[::-1] if alternating and e % 2 else list(range(k)) for e in (epoch - 1, epoch)]
        written = {c: epoch - 1 + orders[0].index(c) / k for c in range(k)}  # time of each chunk's write before
        stale, ages = 0, []
        for s, d in zip(src.tolist(), dst.tolist()):
            now_s, now_d = orders[1].index(s), orders[1].index(d)
            if now_s > now_d:  # the source's chunk runs later this epoch: its row is last epoch's
                stale += 1
                ages.append(epoch + now_d / k - written[s])
        expected = (stale / src.numel(), sum(ages) / len(ages))
        got = stale_read_stats(plan, graph.edge_index, reverse=alternating and epoch % 2 == 1,
                               alternating=alternating)
        assert got == pytest.approx(expected)
    if alternating:  # the odd epoch reads the other direction of the cut edges, its rows younger on average
        fwd, rev = (stale_read_stats(plan, graph.edge_index, reverse=r, alternating=True) for r in (False, True))
        assert fwd != pytest.approx(rev)
