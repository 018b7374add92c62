"""Hybrid parallelism: S pipeline stages x G graph partitions (``graph_parallel_size``)."""

import pytest
import torch

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, find_layer_stack
from lightning_gnnpipe.comm.accounting import KINDS
from lightning_gnnpipe.planner.volume import hybrid_volume
from lightning_gnnpipe.pipeline.split import split_layers
from lightning_gnnpipe.comm.exchange import build_slot_plans, partition_halos
from lightning_gnnpipe.data.chunk_graph import build_chunk_graph
from lightning_gnnpipe.nn.chunk_call import chunk_graph_options
from lightning_gnnpipe.nn.gcn_norm import norm_keys
from tests.helpers import ChunkLossGCN, GCNModule, fit, losses, sbm_graph
from tests.reference import chunked_reference

EPOCHS = 4


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=400)


def test_nested_chunks_and_slot_plans_equal_brute_force(graph):
    G = 2
    dm = GraphChunkDataModule(graph, num_chunks=8, num_parts=G)
    plan, (src, dst) = dm.plan, graph.edge_index
    partition = plan.part % G
    covered = torch.cat(plan.nodes).sort().values
    assert torch.equal(covered, torch.arange(graph.num_nodes))
    halos = partition_halos(plan, G)
    for g in range(G):
        brute = set(src[(partition[dst] == g) & (partition[src] != g)].tolist())
        assert set(halos[g].tolist()) == brute
        for c, sp in enumerate(build_slot_plans(plan, G, g)):
            if c % G != g:
                assert sp is None
                continue
            peers = [c // G * G + q for q in range(G) if q != g]
            expect = {v for p in peers for v in plan.nodes[p].tolist() if v in brute}
            assert set(sp.recv_ids.tolist()) == expect and sp.recv_ids.numel() == len(expect)
            # what chunk c reads live: its halo rows that belong to the same slot's other chunks
            live = {v for p in peers for v in plan.halo[c].tolist() if plan.part[v] == p}
            assert set(plan.halo[c][sp.live_pos].tolist()) == live
            assert torch.equal(plan.halo[c][sp.live_pos], sp.recv_ids[sp.back_sel])
            sent = plan.nodes[c][sp.send_index]
            assert set(sent.tolist()) == {v for v in plan.nodes[c].tolist() if any(
                v in set(halos[q].tolist()) for q in range(G) if q != g)}


def test_one_chunk_per_partition_is_exact_graph_parallelism(tmp_path, graph):
    # S = 1, G = 2, K = G: every halo row arrives live, as in graph parallelism.
    dm = GraphChunkDataModule(graph, num_chunks=2, num_parts=2)
    single = fit(str(tmp_path / "s"), GCNModule(16, 32, 4, 4), dm, devices=1, epochs=EPOCHS)[0]
    ranks = fit(str(tmp_path / "h"), GCNModule(16, 32, 4, 4), dm, devices=2,
                strategy=GNNPipeStrategy(graph_parallel_size=2), epochs=EPOCHS)
    torch.testing.assert_close(losses(ranks[0]), losses(single), atol=1e-5, rtol=0)
    assert losses(ranks[0]) == losses(ranks[1])
    assert ranks[0][-1]["comm/sent/halo_embeddings"] > 0 and ranks[0][-1]["comm/sent/stage_activations"] == 0


@pytest.mark.parametrize("module_cls,schedule", [(GCNModule, "gpipe"), (ChunkLossGCN, "1f1b")])
def test_two_stages_two_partitions_equal_sequential_reference(tmp_path, graph, module_cls, schedule):
    dm = GraphChunkDataModule(graph, num_chunks=8, num_parts=2)
    ref = chunked_reference(module_cls(16, 32, 4, 4), graph, dm.plan, EPOCHS, num_parts=2)
    pipe = chunked_reference(module_cls(16, 32, 4, 4), graph, dm.plan, EPOCHS)
    assert abs(ref[-1] - pipe[-1]) > 1e-5  # the hybrid rule is not the pipeline rule on the same chunks
    ranks = fit(str(tmp_path), module_cls(16, 32, 4, 4), dm, devices=4,
                strategy=GNNPipeStrategy(graph_parallel_size=2, schedule=schedule, refresh_every=0), epochs=EPOCHS)
    torch.testing.assert_close(losses(ranks[0]), ref, atol=1e-6, rtol=0)
    assert all(losses(r) == losses(ranks[0]) for r in ranks)
    # bytes counted from the tensors actually sent equal the analytic formulas, kind by kind
    blocks = find_layer_stack(module_cls(16, 32, 4, 4)).blocks
    stage_params = []
    for layers in split_layers(4, 2):
        params = {id(p): p for i in layers for p in blocks[i].parameters()}.values()
        stage_params.append(sum(p.numel() for p in params) + len(params))
    expected = hybrid_volume(dm.plan, [16, 32, 32, 32, 4], 2, 2, [True] * 4, stage_params)
    assert {k: ranks[0][-1][f"comm/sent/{k}"] for k in KINDS} == expected
    minimum = sum(hybrid_volume(dm.plan, [16, 32, 32, 32, 4], 2, 2, [True] * 4, stage_params, minimum=True).values())
    assert minimum <= ranks[0][-1]["comm/sent_total"] <= 1.05 * minimum


def test_bad_hybrid_layouts_fail_before_spawn(graph):
    from lightning.pytorch import Trainer

    with pytest.raises(ValueError, match="num_parts.*divide `num_chunks` \\(8\\) \\(got 3\\)"):
        GraphChunkDataModule(graph, num_chunks=8, num_parts=3)
    with pytest.raises(ValueError, match="graph_parallel_size` must be an int >= 1 \\(got 0\\)"):
        GNNPipeStrategy(graph_parallel_size=0)
    with pytest.raises(ValueError, match="halo_gradients='stale'` is not supported"):
        GNNPipeStrategy(graph_parallel_size=2, halo_gradients="stale")
    cases = [(GraphChunkDataModule(graph, num_chunks=8, num_parts=2), 3, "cannot form `graph_parallel_size`=2"),
             (GraphChunkDataModule(graph, num_chunks=8), 4, "has num_parts=1")]
    for dm, devices, message in cases:
        trainer = Trainer(accelerator="cpu", devices=devices, strategy=GNNPipeStrategy(graph_parallel_size=2),
                          max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
        with pytest.raises(ValueError, match=message):
            trainer.fit(GCNModule(16, 32, 4, 4), datamodule=dm)


def test_hybrid_rank_keeps_its_partition_tables_and_graph(tmp_path, graph):
    """Each hybrid rank's history tables hold its partition and that partition's halo (not |V|), and its chunk graphs
    only its partition's chunks: at most 1/G of the pure pipeline's tables plus the halo rows; G = 2 keeps under 0.6x
    the graph of every chunk (before, both were the full |V| tables and every chunk's graph)."""
    G, d, layers = 2, 32, 4
    dm = GraphChunkDataModule(graph, num_chunks=8, num_parts=G)
    pipe = fit(str(tmp_path / "p"), GCNModule(16, d, 4, layers), GraphChunkDataModule(graph, num_chunks=8), devices=2,
               strategy=GNNPipeStrategy(halo_gradients="detach"), epochs=2)  # history tables alone (no gradient table)
    hyb = fit(str(tmp_path / "h"), GCNModule(16, d, 4, layers), dm, devices=4,
              strategy=GNNPipeStrategy(graph_parallel_size=G), epochs=2)
    p, h = pipe[0][-1], hyb[0][-1]
    n = graph.num_nodes
    # what one rank would keep with every chunk of the same plan (the pure pipeline's graph): CSR operators, ids
    blocks = find_layer_stack(GCNModule(16, d, 4, layers)).blocks
    full = build_chunk_graph(dm.plan, graph.edge_index, norm_keys(blocks), torch.device("cpu"),
                             **chunk_graph_options(blocks))
    full_graph = full.nbytes() + 8 * sum(a.numel() + b.numel() for a, b in zip(full.nodes, full.halo))
    # pure pipeline: one |V| x d float32 table per layer >= 1 of the stage (stage 0: layer 1; stage 1: layers 2, 3)
    assert [p[f"memory/history_bytes/rank{s}"] for s in range(2)] == [1 * n * d * 4, 2 * n * d * 4]
    halos = partition_halos(dm.plan, G)
    for rank in range(4):
        s, g = rank % 2, rank // 2  # global rank g * S + s
        tables = 1 if s == 0 else 2
        in_part = int((dm.plan.part % G == g).sum())
        rows = in_part + halos[g].numel()
        row_map = 8 * n + 8 * rows  # the stage's |V| -> row map and the row ids (int64), shared by its tables
        assert h[f"memory/history_bytes/rank{rank}"] == tables * rows * d * 4 + row_map
        # the partition's share of the pure pipeline's tables (partitions balanced within 1%), plus its halo rows
        assert in_part <= 1.01 * n / G and rows < n
        assert tables * rows * d * 4 <= 1.01 * p[f"memory/history_bytes/rank{s}"] / G + tables * halos[g].numel() * d * 4
        # its partition's half of the edges and halos, plus every chunk's inner ids (10% of the full graph here)
        assert h[f"memory/graph_bytes/rank{rank}"] <= 0.6 * full_graph


def test_one_partition_exchange_does_nothing_and_a_wrong_one_is_refused():
    """``PartitionExchange()`` (pure pipeline parallelism) keeps the pipeline's own behaviour: every chunk, the
    stage decides its table rows, halo rows straight from the table, sums and gradient sums untouched."""
    from lightning_gnnpipe.comm.partitions import PartitionExchange
    from lightning_gnnpipe.history.history import History

    one = PartitionExchange()
    assert one.chunks(5) == [0, 1, 2, 3, 4] and one.graph_chunks(5) is None
    assert one.table_rows(None, [0, 1]) is None
    t = torch.arange(6.0).view(3, 2)
    assert one.sum(t, "logits") is t and torch.equal(t, torch.arange(6.0).view(3, 2))
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.full((2,), 3.0)
    one.sum_grads([p])
    assert p.grad.tolist() == [3.0, 3.0]
    table = History(4, 2)
    table.push(torch.tensor([2, 3]), torch.tensor([[5.0, 6.0], [7.0, 8.0]]))
    out = torch.zeros(2, 2)
    one.halo_into(torch.zeros(1, 2), 0, torch.tensor([3, 2]), out, table)
    assert out.tolist() == [[7.0, 8.0], [5.0, 6.0]]
    with pytest.raises(ValueError, match=r"`part` must be in \[0, 2\) \(got 2\)"):
        PartitionExchange(num_parts=2, part=2)
    with pytest.raises(ValueError, match="2 partitions need the chunk plan"):
        PartitionExchange(num_parts=2, part=0)
    graph = sbm_graph(num_nodes=40)
    plan = GraphChunkDataModule(graph, num_chunks=4, num_parts=2).plan
    two = PartitionExchange(plan, 2, 0)
    assert two.chunks(4) == [0, 2] and two.graph_chunks(4) == [0, 2]
    with pytest.raises(RuntimeError, match="chunk 1 is not one of partition 0's"):
        two.halo_into(torch.zeros(1, 2), 1, torch.tensor([0]), torch.zeros(1, 2))
    assert two._halo_plan is None  # built at its first use: graph parallelism never needs it
    # the exact forward's exchange: partition 0 receives exactly its halo, in the order partition 1 sends it
    received, sent_by_1 = two._halo_rows().recv_ids, PartitionExchange(plan, 2, 1)._halo_rows().send_ids
    assert torch.equal(received.sort().values, partition_halos(plan, 2)[0]) and torch.equal(received, sent_by_1)
    assert two._halo_rows().recv_counts == [0, received.numel()] and 0 < received.numel() < 40
