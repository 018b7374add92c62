"""GCNII's initial embedding ``x0`` computed on the later stages instead of sent (``pipeline/initial_embedding.py``):
when it is, what crosses the boundaries, and training against the chunked reference."""

import pytest
import torch
from lightning.pytorch import Callback
from torch import nn

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, find_layer_stack
from lightning_gnnpipe.nn import NodeDropout
from lightning_gnnpipe.comm.accounting import KINDS
from lightning_gnnpipe.nn.gcnii import GCNII
from lightning_gnnpipe.pipeline.initial_embedding import deterministic_in_training, recomputes_x0
from tests.helpers import GCNIIModule, MetricRecorder, fit, losses, sbm_graph
from tests.reference import chunked_reference

EPOCHS = 3
HIDDEN = 32
FLOAT = 4


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=400)


class _Input(nn.Module):
    def __init__(self, drop: nn.Module) -> None:
        super().__init__()
        self.lin, self.drop = nn.Linear(16, HIDDEN), drop

    def forward(self, x, edge_index):
        return self.lin(self.drop(x))


def test_recomputed_only_when_block_0_is_node_wise_and_deterministic(graph):
    blocks = list(GCNII(16, HIDDEN, 4, 3, dropout=0.0).blocks)
    assert recomputes_x0(blocks, graph.x, num_stages=2)
    assert not recomputes_x0(blocks, graph.x, num_stages=1)  # no boundary
    assert not recomputes_x0(blocks, graph.x, num_stages=2, graph_parallel_size=2)  # hybrid sends it
    assert not recomputes_x0(blocks[:1] + blocks[-1:], graph.x, num_stages=2)  # nothing takes x0
    assert not recomputes_x0([blocks[1]] + blocks[1:], graph.x, num_stages=2)  # block 0 passes messages
    assert not recomputes_x0(list(GCNII(16, HIDDEN, 4, 3, dropout=0.5).blocks), graph.x, 2)  # nn.Dropout draws
    assert recomputes_x0(list(GCNII(16, HIDDEN, 4, 3, dropout=0.5, node_dropout=True).blocks), graph.x, 2)


def test_the_probe_draws_nothing_and_leaves_the_block_as_it_was(graph):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop, self.norm = nn.Dropout(0.5), nn.BatchNorm1d(16)

        def forward(self, x, edge_index):
            return self.norm(self.drop(x))

    block = Block().eval()
    state = {k: v.clone() for k, v in block.state_dict().items()}
    rng = torch.get_rng_state()
    assert not deterministic_in_training(block, graph.x)
    assert torch.equal(torch.get_rng_state(), rng) and not block.training
    assert all(torch.equal(v, state[k]) for k, v in block.state_dict().items())  # running statistics untouched
    assert deterministic_in_training(_Input(NodeDropout(0.5, seed=3)), graph.x)


@pytest.mark.parametrize("dropout", [None, "nn", "node"])
def test_x0_crosses_no_boundary_unless_block_0_draws(tmp_path, graph, dropout):
    """Stage boundary bytes: the chunk's rows alone when the last stage computes ``x0``, twice that when block 0
    draws a dropout mask (``x0`` sent); block 0's weights (to the last stage) and its gradients (back) each step."""

    class Module(GCNIIModule):
        def __init__(self):
            super().__init__(16, HIDDEN, 4, 4)
            if dropout is not None:
                drop = nn.Dropout(0.5) if dropout == "nn" else NodeDropout(0.5, seed=1)
                self.gnn.blocks[0] = _Input(drop)

    dm = GraphChunkDataModule(graph, num_chunks=4)
    ranks = fit(str(tmp_path), Module(), dm, devices=2, strategy=GNNPipeStrategy(), epochs=2, limit_val_batches=0)
    rows = dm.plan.num_chunks * dm.plan.max_chunk_size
    sent = dropout == "nn"
    params = (16 * HIDDEN + HIDDEN) * FLOAT
    weights = params + (8 if dropout == "node" else 0)  # NodeDropout: its int64 seed, a buffer
    per_kind = {k: ranks[0][-1][f"comm/sent/{k}"] for k in KINDS}
    assert per_kind["stage_activations"] == per_kind["stage_gradients"] == rows * HIDDEN * FLOAT * (2 if sent else 1)
    assert per_kind["weight_allreduce"] == (0 if sent else weights + params)


class _MoveBlock0OnRank1(Callback):
    """Rank 1's copy of block 0 starts away from the owner's: only the broadcast of the owner's weights fixes it."""

    def on_train_start(self, trainer, pl_module):
        if trainer.global_rank == 1:
            with torch.no_grad():
                pl_module.gnn.blocks[0].lin.weight.add_(1.0)


@pytest.mark.parametrize("schedule,stages_per_rank", [("1f1b", 1), ("gpipe", 1), ("interleaved_1f1b", 2)])
def test_gcnii_with_x0_computed_on_each_stage_equals_the_reference(tmp_path, graph, schedule, stages_per_rank):
    """Plain SGD against the chunked reference: block 0's gradient is the sum over the stages that use ``x0``
    (interleaved: rank 0 holds block 0 and a later stage, rank 1 two stages that compute ``x0`` with its copy)."""

    class SGDGCNII(GCNIIModule):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)

    dm = GraphChunkDataModule(graph, num_chunks=4)
    module = SGDGCNII(16, HIDDEN, 4, 4)
    ref = chunked_reference(module, graph, dm.plan, EPOCHS, layers=list(find_layer_stack(module.gnn).blocks))
    ranks = fit(str(tmp_path), SGDGCNII(16, HIDDEN, 4, 4), dm, devices=2, epochs=EPOCHS, limit_val_batches=0,
                strategy=GNNPipeStrategy(schedule=schedule, stages_per_rank=stages_per_rank),
                callbacks=[_MoveBlock0OnRank1(), MetricRecorder(str(tmp_path))])
    torch.testing.assert_close(losses(ranks[1]), ref, atol=1e-6, rtol=0)
    assert ranks[0][-1]["comm/sent/weight_allreduce"] > 0  # block 0's weights and gradients crossed
