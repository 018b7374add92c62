"""The layout planner's cost model, against figures worked out by hand on a path graph."""

import time

import pytest
import torch
from torch import nn

from lightning_gnnpipe.data.chunk import build_chunk_plan
from lightning_gnnpipe.planner.cost import LayoutEstimate, estimate_layouts, format_table, measure_chunk_seconds, \
    measure_layer_seconds, recommend
from tests.helpers import sbm_graph


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=400)


# The path 0 - 1 - ... - 7, both directions. Chunk of every node for each (K chunks, G partitions) the tests plan:
PATH = torch.tensor([[i for i in range(7)] + [i + 1 for i in range(7)], [i + 1 for i in range(7)] + list(range(7))])
PARTS = {(2, 1): [0, 0, 0, 0, 1, 1, 1, 1],
         (4, 1): [0, 0, 0, 1, 2, 2, 3, 3],  # uneven: M = 3 rows
         (4, 2): [0, 0, 2, 2, 3, 3, 1, 1]}  # partition 0 = nodes 0-3 (chunks 0, 2), partition 1 = nodes 4-7 (1, 3)
# Halo of every chunk (out-of-chunk in-neighbours), read off the path by hand:
HALOS = {(2, 1): [{4}, {3}], (4, 1): [{3}, {2, 4}, {3, 6}, {5}], (4, 2): [{2}, {5}, {1, 4}, {3, 6}]}
PARAMS = dict(num_params=10, num_param_tensors=2)  # the all-reduced buffer: 12 values = 48 bytes


def path_plan(edge_index, num_nodes, num_chunks, num_parts=1):
    return build_chunk_plan(edge_index, num_nodes, num_chunks, part=torch.tensor(PARTS[num_chunks, num_parts]))


@pytest.mark.parametrize("key", sorted(PARTS))
def test_the_hand_worked_halos_are_the_paths(key):
    """The halos the figures below rest on, by brute force over the edge list (and as the plan has them)."""
    part = PARTS[key]
    brute = [{int(u) for u, v in PATH.t().tolist() if part[v] == c and part[u] != c} for c in range(key[0])]
    assert brute == HALOS[key]
    assert [set(h.tolist()) for h in path_plan(PATH, 8, *key).halo] == brute


def test_two_processes_by_hand():
    """dims 3 -> 5 -> 2 (L = 2), layers of 0.3 s and 0.1 s, 1000 bytes/s, on 2 processes.

    GNNPipe, 2 stages [[0], [1]], one boundary of width 5, logits 8 x 2 floats = 64 bytes sent to 1 rank:
      K = 2 (M = 4): 2 x (2 x 4 rows x 5 x 4 B) + 64 = 384 B; rows read (4 + 1) + (4 + 1) = 10 of 8 nodes, slowest
      stage 0.3 s x 10/8 x (K + S - 1)/K = 0.5625 s; 384 B / 1 link / 1000 B/s = 0.384 s.
      K = 4 (M = 3): 2 x (4 x 3 x 5 x 4) + 64 = 544 B; rows (3+1) + (1+2) + (2+2) + (2+1) = 14, 0.3 x 14/8 x 5/4 =
      0.65625 s; 0.544 s.
    Graph parallelism, G = 2: halo rows 2, one exchanged layer of width 5 each way: 2 x 40 B; logits all-gathered
      G (G-1) M C x 4 = 64 B; ring all-reduce of 48 B, 2 (G-1)/G x 48 B per rank = 96 B in all: 240 B over 2 links =
      0.12 s; compute 0.4 s x the busiest part's 5/8 rows = 0.25 s.
    """
    est = estimate_layouts(PATH, 8, [3, 5, 2], [0.3, 0.1], 2, bandwidth=1000.0, chunks_per_stage=(1, 2),
                           plan_fn=path_plan, halo_rows_computed=True, **PARAMS)
    expected = [LayoutEstimate("graph_parallel", 1, 2, 2, 240, 0.25, 0.12),
                LayoutEstimate("gnnpipe", 2, 1, 2, 384, 0.5625, 0.384),
                LayoutEstimate("gnnpipe", 2, 1, 4, 544, 0.65625, 0.544)]
    assert [(e.mode, e.stages, e.graph_parallel, e.chunks, e.bytes_per_epoch) for e in est] == [
        (e.mode, e.stages, e.graph_parallel, e.chunks, e.bytes_per_epoch) for e in expected]
    for got, want in zip(est, expected):
        assert (got.compute_seconds, got.comm_seconds) == pytest.approx((want.compute_seconds, want.comm_seconds))


def test_hybrid_on_four_processes_by_hand():
    """The same model on 4 processes (more than its 2 layers: no GNNPipe).

    Graph parallelism, G = 4 (M = 3): halo rows 1 + 2 + 2 + 1 = 6, 2 x 6 x 5 x 4 = 240 B; logits 4 x 3 x 3 x 2 x 4 =
      288 B; all-reduce 4 x (2 x 3 x 48 // 4) = 288 B: 816 B over 4 links = 0.204 s; compute 0.4 s x 4/8 = 0.2 s.
    Hybrid, 2 stages x 2 partitions, K = 4 (M = 2): boundary 2 x (4 x 2 x 5 x 4) = 320 B; logits: each partition's
      last stage sends 64 B to its first, and the two sum theirs (2 x 64 B) = 256 B; halo rows crossing partitions
      {4} and {3}: 2 x 5 x 4 = 40 B; gradients of the halo rows read in the same slot (node 4 into chunk 2, node 3
      into chunk 3): 40 B; each stage all-reduces 6 values over 2 ranks, 2 x 24 B x 2 stages = 96 B: 752 B over 4
      links = 0.188 s; compute 0.3 s x busiest partition's rows (3 + 4)/8 x (2 + 2 - 1)/2 = 0.39375 s.
    """
    est = estimate_layouts(PATH, 8, [3, 5, 2], [0.3, 0.1], 4, bandwidth=1000.0, chunks_per_stage=(1,),
                           plan_fn=path_plan, halo_rows_computed=True, **PARAMS)
    assert [(e.mode, e.stages, e.graph_parallel, e.chunks, e.bytes_per_epoch) for e in est] == [
        ("graph_parallel", 1, 4, 4, 816), ("hybrid", 2, 2, 4, 752)]  # 0.404 s, 0.58175 s
    assert [(e.compute_seconds, e.comm_seconds) for e in est] == [pytest.approx((0.2, 0.204)),
                                                                 pytest.approx((0.39375, 0.188))]
    with pytest.raises(TypeError, match=r"`plan_fn` takes no `num_parts`, which the hybrid layouts of 4 processes "
                                        r"need \(G in \[2\]\)"):
        estimate_layouts(PATH, 8, [3, 5, 2], [0.3, 0.1], 4, bandwidth=1000.0, plan_fn=lambda e, n, k: path_plan(e, n, k))


def test_the_link_decides_between_the_modes_of_a_deep_model():
    """9 layers of width 5 (0.01 s each), 2 processes, by hand: GNNPipe K = 2 (stages of 5 and 4 layers) costs
    0.05 s x 10/8 x 3/2 = 0.09375 s + 384 B over the link; graph parallelism 0.09 s x 5/8 = 0.05625 s + 800 B over 2
    links (8 exchanged layers: 2 x 2 x 8 x 5 x 4 = 640 B, logits 64 B, all-reduce 96 B). They cost the same at
    16 B / 0.0375 s = 426.7 B/s: below it GNNPipe is the faster, above it graph parallelism."""
    dims = [3] + [5] * 8 + [2]
    for bandwidth, mode, seconds in ((100.0, "gnnpipe", 0.09375 + 3.84), (1000.0, "graph_parallel", 0.05625 + 0.4)):
        est = estimate_layouts(PATH, 8, dims, [0.01] * 9, 2, bandwidth=bandwidth, chunks_per_stage=(1, 2),
                               plan_fn=path_plan, halo_rows_computed=True, **PARAMS)
        assert recommend(est) == {"mode": mode, "stages": 2 if mode == "gnnpipe" else 1,
                                  "graph_parallel": 1 if mode == "gnnpipe" else 2, "chunks": 2}
        assert est[0].seconds == pytest.approx(seconds)
        assert "(recommended)" in format_table(est).splitlines()[2]
    # one link shared by both ranks and directions: graph parallelism's 800 B all cross it, 0.05625 s + 0.8 s, and
    # GNNPipe's 384 B as before, 0.09375 s + 0.384 s: now GNNPipe is the faster at 1000 B/s
    shared = estimate_layouts(PATH, 8, dims, [0.01] * 9, 2, bandwidth=1000.0, chunks_per_stage=(1, 2),
                              plan_fn=path_plan, shared_link=True, halo_rows_computed=True, **PARAMS)
    assert recommend(shared)["mode"] == "gnnpipe" and shared[0].seconds == pytest.approx(0.09375 + 0.384)
    assert next(e for e in shared if e.mode == "graph_parallel").seconds == pytest.approx(0.05625 + 0.8)
    # the CSR path computes only inner rows: GNNPipe 0.05 s x 8/8 x 3/2 = 0.075 s, graph parallelism 0.09 s x the
    # busiest part's 4/8 = 0.045 s (the halo rows no longer count)
    inner = estimate_layouts(PATH, 8, dims, [0.01] * 9, 2, bandwidth=1e15, chunks_per_stage=(1,), plan_fn=path_plan,
                             **PARAMS)
    assert {e.mode: e.compute_seconds for e in inner} == pytest.approx({"gnnpipe": 0.075, "graph_parallel": 0.045})


def test_deep_models_favour_gnnpipe_and_slow_links_matter(graph):
    dims = [16] + [64] * 32
    seconds = [0.01] * 32
    slow = estimate_layouts(graph.edge_index, 400, dims, seconds, 4, bandwidth=1e6)
    assert recommend(slow)["mode"] == "gnnpipe"  # graph parallelism moves ~L x more bytes
    gp = next(e for e in slow if e.mode == "graph_parallel")
    pipe = min((e for e in slow if e.mode == "gnnpipe"), key=lambda e: e.bytes_per_epoch)
    assert gp.bytes_per_epoch > 5 * pipe.bytes_per_epoch
    # with free communication and a shallow model, no bubble: graph parallelism wins
    fast = estimate_layouts(graph.edge_index, 400, [16, 64, 4], [0.01, 0.01], 2, bandwidth=1e15)
    assert recommend(fast)["mode"] == "graph_parallel"


def test_bad_arguments(graph):
    with pytest.raises(ValueError, match="one time per layer"):
        estimate_layouts(graph.edge_index, 400, [16, 8, 4], [0.1], 2, bandwidth=1e9)
    with pytest.raises(ValueError, match="bandwidth"):
        estimate_layouts(graph.edge_index, 400, [16, 8, 4], [0.1, 0.1], 2, bandwidth=0)


def test_measured_chunk_seconds_replace_the_scaled_layer_time():
    """``chunk_seconds`` gives each chunk's own layer times; by hand on the path, dims 3 -> 5 -> 2, 2 processes,
    table[K] = seconds of layers (0, 1) on each chunk (stages [[0], [1]]):
      GNNPipe K = 4: stage 0 = 0.1 + 0.2 + 0.3 + 0.4 = 1.0 s, stage 1 = 0.05 x 4 = 0.2 s; 1.0 s x (4 + 1)/4 = 1.25 s
        (the scaled model would charge 0.3 x 14/8 x 5/4 with halo rows);
      graph parallelism K = 2: chunk 0 0.7 + 0.1 = 0.8 s, chunk 1 0.2 + 0.1 = 0.3 s: the busier 0.8 s.
    Hybrid on 4 processes, 2 stages x 2 partitions, K = 4 (partition 0 = chunks 0, 2; 1 = chunks 1, 3): stage 0 of
      partition 0 = 0.1 + 0.3, of partition 1 = 0.2 + 0.4 = 0.6 s, the busiest; x (2 + 2 - 1)/2 = 0.9 s; graph
      parallelism G = 4 on the same table: the busiest chunk, 0.4 + 0.05 = 0.45 s."""
    table = {2: [[0.7, 0.1], [0.2, 0.1]], 4: [[0.1, 0.05], [0.2, 0.05], [0.3, 0.05], [0.4, 0.05]]}
    seen = []

    def chunk_seconds(plan):
        seen.append(plan.num_chunks)
        return table[plan.num_chunks]

    est = estimate_layouts(PATH, 8, [3, 5, 2], None, 2, bandwidth=1e15, chunks_per_stage=(2,), plan_fn=path_plan,
                           chunk_seconds=chunk_seconds, **PARAMS)
    assert {e.mode: e.compute_seconds for e in est} == pytest.approx({"gnnpipe": 1.25, "graph_parallel": 0.8})
    assert sorted(seen) == [2, 4]
    hybrid = estimate_layouts(PATH, 8, [3, 5, 2], None, 4, bandwidth=1e15, chunks_per_stage=(1,), plan_fn=path_plan,
                              chunk_seconds=chunk_seconds, **PARAMS)
    assert {e.mode: e.compute_seconds for e in hybrid} == pytest.approx({"hybrid": 0.9, "graph_parallel": 0.45})
    with pytest.raises(ValueError, match=r"one time per layer \(2\) for each of the plan's 4 chunks \(got \[2\]\)"):
        estimate_layouts(PATH, 8, [3, 5, 2], None, 2, bandwidth=1e15, chunks_per_stage=(2,), plan_fn=path_plan,
                         chunk_seconds=lambda plan: [[0.1, 0.1]])
    with pytest.raises(ValueError, match="`layer_seconds`.*or `chunk_seconds`"):
        estimate_layouts(PATH, 8, [3, 5, 2], None, 2, bandwidth=1e15)


def test_measure_chunk_seconds_times_every_block_on_every_chunk(graph):
    """Each block's time on each chunk of a real plan includes its sleep (one warm-up, one timed run), and no
    gradient is left behind."""
    blocks = [_Sleep(0.02), _Sleep(0.06)]
    plan = build_chunk_plan(graph.edge_index, graph.num_nodes, 3)
    table = measure_chunk_seconds(blocks, graph.x[:, :3].contiguous(), graph.edge_index)(plan)
    assert len(table) == 3 and all(len(row) == 2 for row in table)
    for row in table:
        assert 0.02 <= row[0] < 0.02 + 0.1 and 0.06 <= row[1] < 0.06 + 0.1
    assert len(blocks[0].seen) == 1 + 3 * 2  # one call reads the widths, then 3 chunks x (warm-up + timed run)
    assert all(p.grad is None for b in blocks for p in b.parameters())
    with pytest.raises(ValueError, match=r"`repeats` must be >= 1 timed runs \(got 0\)"):
        measure_chunk_seconds(blocks, graph.x, graph.edge_index, repeats=0)
    from lightning_gnnpipe.pipeline.balance import profile_chunk_costs

    with pytest.raises(ValueError, match=r"chunks in \[0, 3\) \(got repeats=1, chunks=\[3\]\)"):
        profile_chunk_costs(blocks, plan, graph.edge_index, graph.x[:, :3].contiguous(), chunks=[3])


class _Sleep(nn.Module):
    """Doubles its input after sleeping ``seconds``; records the mean of every input it gets."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds, self.seen = seconds, []
        self.scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, x, edge_index):
        self.seen.append(float(x.detach().mean()))
        time.sleep(self.seconds)
        return x * self.scale


def test_measure_layer_seconds_times_each_block_on_the_previous_output():
    blocks = [_Sleep(0.05), _Sleep(0.15)]
    times = measure_layer_seconds(blocks, torch.ones(4, 3), torch.zeros(2, 0, dtype=torch.long), repeats=2)
    assert 0.05 <= times[0] < 0.05 + 0.1 and 0.15 <= times[1] < 0.15 + 0.1  # the sleep, plus at most 0.1 s
    assert blocks[0].seen == [1.0] * 3 and blocks[1].seen == [2.0] * 3  # 2 timed runs + 1 to pass the output on
    assert all(p.grad is None for b in blocks for p in b.parameters())


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
