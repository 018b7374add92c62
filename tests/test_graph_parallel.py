"""Graph parallelism: exact full-graph training, halo plans, and byte counts vs the formulas."""

import pytest
import torch
from lightning.pytorch import Trainer
from torch_geometric.nn.models import GCN, GraphSAGE

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, GraphParallelStrategy
from lightning_gnnpipe.comm.accounting import KINDS, CommStats
from lightning_gnnpipe.comm.exchange import build_slot_plans
from tests.helpers import GCNModule, GNNModule, fit, losses, sbm_graph

EPOCHS = 5
F_IN, HIDDEN, LAYERS, CLASSES = 16, 32, 4, 4
FLOAT = 4  # bytes


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=400)


@pytest.fixture(scope="module")
def single(graph, tmp_path_factory):
    dm = GraphChunkDataModule(graph, num_chunks=1)
    out = fit(str(tmp_path_factory.mktemp("single")), GCNModule(F_IN, HIDDEN, LAYERS, CLASSES), dm, devices=1,
              epochs=EPOCHS)
    return losses(out[0])


def num_params(module):
    return sum(p.numel() for p in module.parameters())


def test_halo_plan_delivers_every_halo_row(graph):
    plan = GraphChunkDataModule(graph, num_chunks=3).plan
    halos = [build_slot_plans(plan, 3, r)[r] for r in range(3)]  # graph parallelism: one slot, K = G
    for r in range(3):
        arrived = []
        for q in range(3):  # what q sends to r: its block number r, ids in global numbering
            start = sum(halos[q].send_counts[:r])
            block = halos[q].send_index[start: start + halos[q].send_counts[r]]
            arrived.append(plan.nodes[q][block])
        assert [int(a.numel()) for a in arrived] == halos[r].recv_counts
        assert torch.equal(torch.cat(arrived), halos[r].recv_ids)
        out = torch.full((plan.halo[r].numel(),), -1, dtype=torch.long)
        out[halos[r].live_pos] = torch.cat(arrived)[halos[r].back_sel]
        assert torch.equal(out, plan.halo[r])


@pytest.mark.parametrize("parts", [2, 4])
def test_equals_single_device_and_counts_bytes(tmp_path, graph, single, parts):
    dm = GraphChunkDataModule(graph, num_chunks=parts)
    module = GCNModule(F_IN, HIDDEN, LAYERS, CLASSES)
    ranks = fit(str(tmp_path), module, dm, devices=parts, strategy=GraphParallelStrategy(), epochs=EPOCHS)
    torch.testing.assert_close(losses(ranks[0]), single, atol=1e-5, rtol=0)
    assert all(r == ranks[0] for r in ranks)  # every rank logs the same values

    # Analytic volume: halo rows H = sum_r |halo_r| of width d_l at every layer l >= 1 (layer 0 reads
    # the replicated features), forward and backward; logits all-gather of G padded blocks of M rows;
    # ring all-reduce of all parameters plus one has-grad flag per parameter tensor.
    halo = sum(int(h.numel()) for h in dm.plan.halo)
    widths = [HIDDEN] * (LAYERS - 1)
    m = dm.plan.max_chunk_size
    flat = (num_params(module) + len(list(module.parameters()))) * FLOAT
    expected = {
        "halo_embeddings": halo * sum(widths) * FLOAT,
        "halo_gradients": halo * sum(widths) * FLOAT,
        "logits": parts * (parts - 1) * m * CLASSES * FLOAT,
        "weight_allreduce": parts * (2 * (parts - 1) * flat // parts),
        "stage_activations": 0,
        "stage_gradients": 0,
    }
    for epoch in ranks[0]:
        assert {k: epoch[f"comm/sent/{k}"] for k in KINDS} == expected
        assert all(epoch[f"comm/wait_s/rank{r}"] > 0 for r in range(parts))


def test_gnnpipe_counts_stage_bytes(tmp_path, graph):
    stages, chunks = 2, 4
    dm = GraphChunkDataModule(graph, num_chunks=chunks)
    ranks = fit(str(tmp_path), GCNModule(F_IN, HIDDEN, LAYERS, CLASSES), dm, devices=stages,
                strategy=GNNPipeStrategy(), epochs=2)
    m, n = dm.plan.max_chunk_size, graph.num_nodes
    # One boundary of width HIDDEN: K padded chunks of M rows forward, the same backward.
    boundary = chunks * m * HIDDEN * FLOAT
    for epoch in ranks[0]:
        assert epoch["comm/sent/stage_activations"] == boundary
        assert epoch["comm/sent/stage_gradients"] == boundary
        assert epoch["comm/sent/logits"] == (stages - 1) * n * CLASSES * FLOAT
        assert epoch["comm/sent/halo_embeddings"] == epoch["comm/sent/weight_allreduce"] == 0
        # Padding: the measured bytes stay within 5 % of the analytic minimum 2 (S-1) |V| d.
        minimum = 2 * (stages - 1) * n * HIDDEN * FLOAT
        assert minimum <= 2 * boundary <= 1.05 * minimum
        for r in range(stages):
            parts = [epoch[f"comm/{k}/rank{r}"] for k in ("compute_s", "bubble_s", "wait_s")]
            assert min(parts) >= 0 and parts[0] > 0
            assert sum(parts) == pytest.approx(epoch[f"comm/step_s/rank{r}"], rel=1e-6)


def test_rejects_parts_other_than_devices(graph):
    trainer = Trainer(accelerator="cpu", devices=2, strategy=GraphParallelStrategy(), max_epochs=1, logger=False,
                      enable_progress_bar=False, enable_checkpointing=False)
    with pytest.raises(ValueError, match=r"number of processes 2, one graph part per process \(got num_chunks=4\)"):
        trainer.fit(GCNModule(F_IN, HIDDEN, LAYERS, CLASSES), datamodule=GraphChunkDataModule(graph, num_chunks=4))


def test_norm_checks_name_the_partition(graph):
    # A part's block sees only its rows, as a chunk's does: a graph-wide norm is refused before any process starts,
    # BatchNorm warns.
    trainer = Trainer(accelerator="cpu", devices=2, strategy=GraphParallelStrategy(), max_epochs=1, logger=False,
                      enable_progress_bar=False, enable_checkpointing=False)
    dm = GraphChunkDataModule(graph, num_chunks=2)
    with pytest.raises(ValueError, match=r"GraphParallelStrategy: layer 0 holds GraphNorm, which normalises over all "
                                         r"the rows it is given; each process gives it one partition's rows"):
        trainer.fit(GNNModule(GCN(F_IN, HIDDEN, LAYERS, CLASSES, norm="graph_norm")), datamodule=dm)
    with pytest.warns(UserWarning, match=r"GraphParallelStrategy: layer 0 holds BatchNorm; in training its "
                                         r"statistics are computed per partition"):
        trainer.strategy.check(trainer, GNNModule(GraphSAGE(F_IN, HIDDEN, LAYERS, CLASSES, norm="batch_norm")), dm)


def test_comm_stats_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown kind 'halo'"):
        CommStats().record("halo", sent=1)


class _Event:
    """A stand-in for ``torch.cuda.Event``: its time is set when recorded, read with ``elapsed_time`` (ms)."""

    def __init__(self, at: float) -> None:
        self.at = at

    def elapsed_time(self, later: "_Event") -> float:
        return (later.at - self.at) * 1e3


def test_waits_timed_by_device_events_are_settled_once():
    """On CUDA a wait is the time between two events on the stream, resolved after the step's one synchronisation:
    nothing is added before :meth:`CommStats.settle`, and :meth:`reset` keeps the clock."""
    from lightning_gnnpipe.comm.accounting import StepClock

    stream_time = iter([1.0, 1.25, 3.0, 3.5])  # two waits of 0.25 s and 0.5 s on the device

    class DeviceClock(StepClock):
        def mark(self):
            return _Event(next(stream_time))

    stats = CommStats(clock=DeviceClock(torch.device("cuda", 0)))  # no CUDA call made
    for _ in range(2):
        with stats.waiting():
            pass
    assert stats.wait_s == 0.0  # on the host nothing is known yet
    stats.settle()
    assert stats.wait_s == pytest.approx(0.75)
    stats.reset()
    assert isinstance(stats.clock, DeviceClock) and stats.wait_s == 0.0 and stats._pending == []
    assert not StepClock(torch.device("cpu")).cuda and StepClock(torch.device("cuda", 0)).cuda
