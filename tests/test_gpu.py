"""GPU variants of key tests: the stage, a one-process NCCL fit and the DataModule's plan on CUDA against the CPU.

Every test here is skipped without CUDA. On a GPU machine: ``python3 -m pytest -q tests/test_gpu.py``.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn.models import GCN

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, build_chunk_plan, find_layer_stack
from lightning_gnnpipe.data.chunk_graph import build_chunk_graph
from lightning_gnnpipe.nn.gcn_norm import norm_keys
from lightning_gnnpipe.nn.stack import infer_dims, takes_x0
from lightning_gnnpipe.pipeline.split import split_layers
from lightning_gnnpipe.pipeline.stage import GNNStage
from tests.helpers import GCNModule, _fit_here, fit, losses, one_thread, read_metrics, sbm_graph  # noqa: F401 (fixture)
from tests.test_stage import make_stages

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda")


def make_stages_on(device, gnn, data, num_chunks, num_stages, **options):
    """:func:`tests.test_stage.make_stages` (edge-list kernels) with the stages, graphs and features on ``device``."""
    gnn = copy.deepcopy(gnn).to(device)
    stack = find_layer_stack(gnn)
    plan = build_chunk_plan(data.edge_index, data.num_nodes, num_chunks)
    x = data.x.to(device)
    dims = infer_dims(stack.blocks, x[:2])
    stages = []
    for layers in split_layers(stack.num_layers, num_stages):
        blocks = [stack.blocks[i] for i in layers]
        graph = build_chunk_graph(plan, data.edge_index, norm_keys(blocks), device)
        stages.append(GNNStage(blocks, layers, dims, graph, x=x if 0 in layers else None,
                               carry_x0=any(takes_x0(b) for b in stack.blocks), **options))
    return plan, stages


def forward_backward(plan, stages, data, device):
    """Refresh the tables, run every chunk through the stages, back-propagate a masked loss.

    Returns the full-graph output ``(|V|, C)`` and every stage parameter's gradient, on the CPU.
    """
    x, y, mask = data.x.to(device), data.y.to(device), data.train_mask.to(device)
    with torch.no_grad():
        h = x
        for stage in stages:
            h = stage.forward_full(h, write_history=True)
    m = plan.max_chunk_size
    x_pad = plan.pad(x)
    out = torch.zeros(x.size(0), h.size(-1), device=device)
    for c in range(plan.num_chunks):
        h = x_pad[c * m: (c + 1) * m]
        for stage in stages:
            h = stage(h, chunk_id=torch.tensor([c]))
        out = out.index_put((plan.nodes[c].to(device),), h[: plan.nodes[c].numel()])
    F.cross_entropy(out[mask], y[mask]).backward()
    grads = [p.grad.detach().cpu() for s in stages for p in s.parameters() if p.grad is not None]
    return out.detach().cpu(), grads


def test_stage_forward_backward_on_cuda_equals_cpu(one_thread):
    data = sbm_graph(300)
    torch.manual_seed(0)
    gnn = GCN(16, 32, 4, 4).eval()
    plan_cpu, cpu = make_stages(gnn, data, num_chunks=4, num_stages=2)
    plan_gpu, gpu = make_stages_on(CUDA, gnn, data, num_chunks=4, num_stages=2)
    assert plan_cpu.fingerprint() == plan_gpu.fingerprint()
    assert all(p.is_cuda for s in gpu for p in s.parameters())
    out_cpu, grads_cpu = forward_backward(plan_cpu, cpu, data, torch.device("cpu"))
    out_gpu, grads_gpu = forward_backward(plan_gpu, gpu, data, CUDA)
    torch.testing.assert_close(out_gpu, out_cpu, atol=1e-5, rtol=0)
    assert len(grads_gpu) == len(grads_cpu) > 0
    for g, c in zip(grads_gpu, grads_cpu):
        torch.testing.assert_close(g, c, atol=1e-5, rtol=0)


def test_one_process_nccl_fit_equals_single_device_cpu(tmp_path, monkeypatch, one_thread):
    """``devices=1`` passes the strategy's layout checks (one stage holding every layer); with ``num_chunks=1``
    the pipelined step is the plain full-graph step, so the losses match the plain CPU fit."""
    import torch.distributed as dist

    from tests.world import free_port

    graph, epochs = sbm_graph(300), 3
    dm = GraphChunkDataModule(graph, num_chunks=1)
    single = fit(str(tmp_path / "cpu"), GCNModule(16, 32, 4, 4), dm, devices=1, epochs=epochs)[0]
    # torchrun-style environment: the strategy's launcher does nothing and fit runs in this process.
    for key, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="1", RANK="0",
                           LOCAL_RANK="0", NODE_RANK="0").items():
        monkeypatch.setenv(key, value)
    try:
        _fit_here(str(tmp_path / "gpu"), GCNModule(16, 32, 4, 4), dm, 1,
                  GNNPipeStrategy(process_group_backend="nccl"), epochs, dict(accelerator="gpu"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    gpu = read_metrics(str(tmp_path / "gpu"))
    assert len(losses(gpu)) == epochs
    torch.testing.assert_close(losses(gpu), losses(single), atol=1e-4, rtol=0)


def test_datamodule_on_a_cuda_graph_builds_the_cpu_plan():
    graph = sbm_graph(300)
    cpu = GraphChunkDataModule(graph, num_chunks=4)
    gpu = GraphChunkDataModule(graph.cuda(), num_chunks=4)
    assert gpu.plan.fingerprint() == cpu.plan.fingerprint()
