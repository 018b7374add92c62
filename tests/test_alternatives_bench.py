"""The alternatives benchmark's own parts: its Cluster-GCN batches are PyG's induced subgraphs, its fanouts follow
PyG's example, its early stopping is Lightning's rule. (The benchmark itself is not a test.)"""

import torch
from torch_geometric.utils import subgraph

from benchmarks.alternatives.baselines import ClusterBatches, neighbor_fanouts
from benchmarks.alternatives.worker import Stopper
from tests.helpers import sbm_graph


def _pairs(edge_index):
    return sorted(map(tuple, edge_index.t().tolist()))


def test_cluster_batches_are_the_subgraphs_their_clusters_induce():
    data = sbm_graph(num_nodes=400)
    batches = ClusterBatches(data, num_parts=16, batch_size=5, seed=1)
    assert len(batches) == 4
    for epoch in range(2):
        seen = []
        for batch in batches:
            expected, _ = subgraph(batch.n_id, data.edge_index, relabel_nodes=True, num_nodes=data.num_nodes)
            assert _pairs(batch.edge_index) == _pairs(expected)
            assert torch.equal(batch.x, data.x[batch.n_id]) and torch.equal(batch.y, data.y[batch.n_id])
            assert torch.equal(batch.train_mask, data.train_mask[batch.n_id])
            seen.append(batch.n_id)
        assert torch.equal(torch.cat(seen).sort().values, torch.arange(data.num_nodes))  # every node once an epoch
    first = [b.n_id for b in ClusterBatches(data, num_parts=16, batch_size=5, seed=1)]
    again = [b.n_id for b in ClusterBatches(data, num_parts=16, batch_size=5, seed=1)]
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # seeded


def test_neighbor_fanouts_extend_the_examples_two():
    assert neighbor_fanouts(2) == [25, 10]
    assert neighbor_fanouts(4) == [25, 10, 5, 5]
    assert neighbor_fanouts(1) == [25]


def test_stopper_is_lightnings_early_stopping_and_a_budget():
    stop = Stopper({"max_epochs": 100, "patience": 2, "budget_s": None})
    accs = [0.1, 0.3, 0.3, 0.2, 0.5]
    ends = []
    for e, a in enumerate(accs):
        ends.append(stop.done({"train_s": 1.0, "val_s": 0.0, "val_acc": a}, e))
        if ends[-1]:
            break
    assert ends == [False, False, False, True]  # epochs 2 and 3 without a better one
    assert stop.why == "early stopping"
    budget = Stopper({"max_epochs": 100, "patience": None, "budget_s": 2.5})
    assert [budget.done({"train_s": 1.0, "val_s": 0.0, "val_acc": e}, e) for e in range(3)] == [False, False, True]
    assert budget.why == "budget"
    fixed = Stopper({"max_epochs": 100, "epochs": 2, "patience": 1})
    assert [fixed.done({"train_s": 1.0, "val_s": 0.0, "val_acc": 0.5}, e) for e in range(2)] == [False, True]


def test_the_page_is_what_its_records_give(tmp_path):
    """docs/results/alternatives.md is rendered again from runs.jsonl and its hand-written blocks: equal, and a table
    figure changed by hand would differ."""
    from benchmarks.alternatives.bench import PAGE, load
    from benchmarks.alternatives.page import read_sections, render

    records, text = load(), PAGE.read_text()
    assert render(records, read_sections(PAGE), PAGE) == text, "run python -m benchmarks.alternatives.bench --page-only"
    row = next(line for line in text.splitlines() if line.startswith("| ") and " s (" in line)
    edited = tmp_path / PAGE.name
    edited.write_text(text.replace(row, row.replace(" s (", "0 s (", 1), 1))
    assert render(records, read_sections(edited), edited) != edited.read_text()
