"""The layout planner's cost model."""

import pytest
import torch
from torch_geometric.nn.models import GCN

from lightning_gnnpipe import find_layer_stack
from lightning_gnnpipe.planner.cost import estimate_layouts, format_table, measure_layer_seconds, recommend
from lightning_gnnpipe.planner.volume import pipeline_volume
from lightning_gnnpipe.data.chunk import build_chunk_plan
from tests.helpers import sbm_graph


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=400)


def test_deep_models_favour_gnnpipe_and_slow_links_matter(graph):
    dims = [16] + [64] * 32
    seconds = [0.01] * 32
    slow = estimate_layouts(graph.edge_index, 400, dims, seconds, 4, bandwidth=1e6)
    assert recommend(slow)["mode"] == "gnnpipe"  # graph parallelism moves ~L x more bytes
    gp = next(e for e in slow if e.mode == "graph_parallel")
    pipe = min((e for e in slow if e.mode == "gnnpipe"), key=lambda e: e.bytes_per_epoch)
    assert gp.bytes_per_epoch > 5 * pipe.bytes_per_epoch
    # bytes are the analytic volume of the same plan
    plan = build_chunk_plan(graph.edge_index, 400, pipe.chunks)
    assert pipe.bytes_per_epoch == sum(pipeline_volume(plan, dims, 4).values())
    # with free communication and a shallow model, no bubble: graph parallelism wins
    fast = estimate_layouts(graph.edge_index, 400, [16, 64, 4], [0.01, 0.01], 2, bandwidth=1e15)
    assert recommend(fast)["mode"] == "graph_parallel"
    assert "(recommended)" in format_table(fast).splitlines()[2]


def test_bad_arguments(graph):
    with pytest.raises(ValueError, match="one time per layer"):
        estimate_layouts(graph.edge_index, 400, [16, 8, 4], [0.1], 2, bandwidth=1e9)
    with pytest.raises(ValueError, match="bandwidth"):
        estimate_layouts(graph.edge_index, 400, [16, 8, 4], [0.1, 0.1], 2, bandwidth=0)


def test_measure_layer_seconds(graph):
    torch.manual_seed(0)
    gnn = GCN(16, 32, 3, 4)
    blocks = find_layer_stack(gnn).blocks
    times = measure_layer_seconds(blocks, graph.x, graph.edge_index, repeats=2)
    assert len(times) == 3 and all(t > 0 for t in times)
    assert all(p.grad is None for p in gnn.parameters())


def test_hybrid_layouts_are_estimated(graph):
    from lightning_gnnpipe.planner.volume import hybrid_volume
    from lightning_gnnpipe.data.partition import nested_partition

    dims = [16] + [64] * 8
    est = estimate_layouts(graph.edge_index, 400, dims, [0.01] * 8, 4, bandwidth=1e8, chunks_per_stage=(2,))
    assert {(e.mode, e.stages, e.graph_parallel) for e in est} == {
        ("gnnpipe", 4, 1), ("graph_parallel", 1, 4), ("hybrid", 2, 2)}
    hybrid = next(e for e in est if e.mode == "hybrid")
    plan = build_chunk_plan(graph.edge_index, 400, 8, part=nested_partition(graph.edge_index, 400, 2, 4))
    assert hybrid.chunks == 8
    assert hybrid.bytes_per_epoch == sum(hybrid_volume(plan, dims, 2, 2, [True] * 8, [0, 0]).values())


def _bandwidth_worker(rank: int, store_path: str, out: str) -> None:
    import datetime

    import torch.distributed as dist

    from lightning_gnnpipe.planner.cost import measure_bandwidth

    store = dist.FileStore(store_path, 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    try:
        torch.save(measure_bandwidth(nbytes=1 << 20, repeats=2), f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_measure_bandwidth_two_ranks(tmp_path):
    import torch.multiprocessing as mp

    from lightning_gnnpipe.planner.cost import measure_bandwidth

    out = str(tmp_path / "bw")
    mp.spawn(_bandwidth_worker, args=(str(tmp_path / "store"), out), nprocs=2)
    values = [torch.load(f"{out}.{r}") for r in range(2)]
    assert values[0] == values[1] and 1e6 < values[0] < float("inf")  # every rank gets rank 0's bytes/s
    with pytest.raises(ValueError, match="nbytes >= 4"):
        measure_bandwidth(nbytes=0)


def test_bandwidth_buffer_on_the_backends_device():
    """NCCL refuses CPU tensors: the default buffer follows the process group's backend."""
    from lightning_gnnpipe.planner.cost import backend_device

    assert backend_device("nccl") == backend_device("cpu:gloo,cuda:nccl") == torch.device("cuda")
    assert backend_device("gloo") == torch.device("cpu")
