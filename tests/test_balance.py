"""Stage balancing by measured layer cost: the partition algorithm and the profiler."""

import itertools
import random

import pytest
import torch
from torch_geometric.nn.models import GCN, GraphSAGE

from lightning_gnnpipe import GNNPipeStrategy, build_chunk_plan, find_layer_stack
from lightning_gnnpipe.nn.gcnii import GCNII
from lightning_gnnpipe.pipeline.balance import balanced_split, profile_layer_costs, stage_layers
from lightning_gnnpipe.pipeline.split import split_layers
from tests.helpers import one_thread  # noqa: F401 (fixture)


def brute_force(costs, num_stages):
    """Smallest largest-stage cost over every contiguous cut into ``num_stages`` non-empty runs."""
    n = len(costs)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), num_stages - 1):
        bounds = (0,) + cuts + (n,)
        best = min(best, max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:])))
    return best


def test_balanced_split_is_optimal_against_brute_force():
    rng = random.Random(0)
    cases = 0
    for n in range(1, 8):
        for s in range(1, n + 1):
            for _ in range(6):
                costs = [rng.choice([0.0, 1.0, rng.uniform(0, 10), rng.uniform(0, 100)]) for _ in range(n)]
                split = balanced_split(costs, s)
                assert len(split) == s and all(split) and sum(split, []) == list(range(n))
                got = max(sum(costs[i] for i in run) for run in split)
                assert got == pytest.approx(brute_force(costs, s), abs=1e-9)
                cases += 1
    assert cases == 6 * sum(range(1, 8))


def test_balanced_split_moves_layers_off_a_heavy_first_layer():
    # GCN on Cora: layer 0 maps 1433 features, the others 64.
    costs = [10.0] + [1.0] * 15
    assert split_layers(16, 2) == [list(range(8)), list(range(8, 16))]  # stage costs 17 vs 8
    assert balanced_split(costs, 2) == [[0, 1, 2, 3], list(range(4, 16))]  # 13 vs 12 (ties: later stages lighter)
    assert balanced_split([1.0] * 6, 3) == [[0, 1], [2, 3], [4, 5]]


@pytest.mark.parametrize("costs,stages,match", [
    ([1.0, 2.0], 3, "cannot place 2 layers on 3 stages"),
    ([1.0, 2.0], 0, "cannot place 2 layers on 0 stages"),
    ([1.0, -2.0], 1, "finite and non-negative"),
    ([1.0, float("inf")], 1, "finite and non-negative"),
])
def test_balanced_split_errors(costs, stages, match):
    with pytest.raises(ValueError, match=match):
        balanced_split(costs, stages)


def test_unknown_balance_is_refused():
    with pytest.raises(ValueError, match=r"unknown `balance` 'memory'. Use one of \['count', 'time'\]"):
        GNNPipeStrategy(balance="memory")


def test_profile_measures_each_layer_and_changes_nothing(cora, one_thread):
    torch.manual_seed(0)
    gnn = GraphSAGE(cora.num_features, 64, 4, 7, norm="batch_norm", dropout=0.5)
    blocks = find_layer_stack(gnn).blocks
    plan = build_chunk_plan(cora.edge_index, cora.num_nodes, 4)
    before = {k: v.clone() for k, v in gnn.state_dict().items()}
    rng = torch.get_rng_state()
    costs = profile_layer_costs(blocks, plan, cora.edge_index, cora.x)
    assert len(costs) == 4 and all(c > 0 for c in costs)
    assert all(p.grad is None for p in gnn.parameters())
    assert all(torch.equal(before[k], v) for k, v in gnn.state_dict().items())  # BatchNorm statistics too
    assert torch.equal(torch.get_rng_state(), rng)


def test_profile_times_blocks_that_take_x0(cora, one_thread):
    gnn = GCNII(cora.num_features, 32, 7, 4, dropout=0.0)  # GCNII layers are called (x, edge_index, x0)
    plan = build_chunk_plan(cora.edge_index, cora.num_nodes, 4)
    costs = profile_layer_costs(gnn.pipeline_blocks(), plan, cora.edge_index, cora.x)
    assert len(costs) == 6 and all(c > 0 for c in costs)


def test_stage_layers_without_process_group(cora, one_thread):
    gnn = GCN(cora.num_features, 16, 6, 7)
    blocks = find_layer_stack(gnn).blocks
    plan = build_chunk_plan(cora.edge_index, cora.num_nodes, 4)
    assert stage_layers("count", blocks, 3, plan, cora.edge_index, cora.x) == split_layers(6, 3)
    timed = stage_layers("time", blocks, 3, plan, cora.edge_index, cora.x)
    assert len(timed) == 3 and sum(timed, []) == list(range(6))
