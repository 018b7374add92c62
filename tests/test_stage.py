"""The stage module against the unsplit model, in one process."""

import pytest
import torch
from torch_geometric.nn.models import GAT, GCN, GIN, GraphSAGE

from lightning_gnnpipe import build_chunk_plan, find_layer_stack
from lightning_gnnpipe.nn.stack import infer_dims, takes_x0
from lightning_gnnpipe.data.chunk_graph import build_chunk_graph
from lightning_gnnpipe.nn.chunk_call import chunk_graph_options
from lightning_gnnpipe.nn.gcn_norm import norm_keys
from lightning_gnnpipe.pipeline.loss import PipelineLoss
from lightning_gnnpipe.pipeline.split import split_layers
from lightning_gnnpipe.pipeline.stage import GNNStage

MODELS = {
    "gcn": lambda f, c: GCN(f, 32, 4, c),
    "sage": lambda f, c: GraphSAGE(f, 32, 3, c),
    "gat": lambda f, c: GAT(f, 16, 3, c, heads=2),
    "gin": lambda f, c: GIN(f, 32, 3, c),
}


def make_stages(gnn, data, num_chunks, num_stages, sparse=False, **options):
    stack = find_layer_stack(gnn)
    plan = build_chunk_plan(data.edge_index, data.num_nodes, num_chunks)
    dims = infer_dims(stack.blocks, data.x[:2])
    stages = []
    x0_block = options.pop("x0_block", None)  # each later stage computes x0 with it (the features then go there too)
    for layers in split_layers(stack.num_layers, num_stages):
        blocks = [stack.blocks[i] for i in layers]
        kernels = chunk_graph_options(blocks) if sparse else {}  # as the strategies build them
        graph = build_chunk_graph(plan, data.edge_index, norm_keys(blocks), torch.device("cpu"), **kernels)
        x0 = {"x0_block": x0_block} if x0_block is not None else {}
        stages.append(GNNStage(blocks, layers, dims, graph, x=data.x if 0 in layers or x0 else None,
                               carry_x0=any(takes_x0(b) for b in stack.blocks), **options, **x0))
    return plan, stages


def refreshed_chunked_forward(plan, stages, x):
    """Refresh every table exactly, then run every chunk through the stages; return ``(|V|, C)``."""
    h = x
    for stage in stages:  # refresh: every table holds the exact inputs of its layer
        h = stage.forward_full(h, write_history=True)
    m = plan.max_chunk_size
    x_pad = plan.pad(x)
    out = torch.zeros(x.size(0), h.size(-1))
    for c in range(plan.num_chunks):
        h = x_pad[c * m: (c + 1) * m]
        for stage in stages:
            h = stage(h, chunk_id=torch.tensor([c]))
        out[plan.nodes[c]] = h[: plan.nodes[c].numel()]
    return out


def test_stale_halo_gradients_reach_the_exact_gradient_at_fixed_weights(cora):
    """PipeGCN-style stale halo gradients, applied one epoch late, add the gradient paths that cross chunks one
    hop per epoch: with the weights held fixed, L epochs give the unsplit model's gradient; detached halos never do.
    """
    torch.manual_seed(0)
    gnn = MODELS["gcn"](cora.num_features, 7).eval()  # 4 layers, no dropout
    loss = lambda out: torch.nn.functional.cross_entropy(out[cora.train_mask], cora.y[cora.train_mask])  # noqa: E731
    loss(gnn(cora.x, cora.edge_index)).backward()
    exact = [p.grad.clone() for p in gnn.parameters()]
    errors = {}
    for mode in ("detach", "stale"):
        plan, stages = make_stages(gnn, cora, num_chunks=8, num_stages=2, halo_gradients=mode)
        errors[mode] = []
        for _ in range(4):  # epochs at the same weights
            for stage in stages:
                stage.next_epoch()
            gnn.zero_grad()
            loss(refreshed_chunked_forward(plan, stages, cora.x)).backward()
            grads = [p.grad for p in gnn.parameters()]
            errors[mode].append(float(torch.cat([(g - e).reshape(-1) for g, e in zip(grads, exact)]).norm()
                                      / torch.cat([e.reshape(-1) for e in exact]).norm()))
        if mode == "stale":
            for g, e in zip(grads, exact):
                torch.testing.assert_close(g, e, atol=1e-6, rtol=1e-4)
    assert errors["detach"][0] == pytest.approx(errors["stale"][0])  # nothing applied yet in the first epoch
    assert min(errors["detach"]) > 1e-2  # the cut edges' gradient is missing every epoch
    assert errors["stale"][1] < errors["stale"][0] / 2  # one more hop recovered each epoch


def test_chunked_forward_with_fresh_tables_equals_unsplit(cora):
    torch.manual_seed(0)
    gnn = GCN(cora.num_features, 32, 4, 7)
    plan, stages = make_stages(gnn, cora, num_chunks=8, num_stages=2)
    out = refreshed_chunked_forward(plan, stages, cora.x)
    torch.testing.assert_close(out, gnn(cora.x, cora.edge_index), atol=1e-5, rtol=1e-5)


def test_padding_rows_never_reach_outputs(cora):
    torch.manual_seed(0)
    gnn = GCN(cora.num_features, 16, 2, 7)
    plan, (stage,) = make_stages(gnn, cora, num_chunks=5, num_stages=1)
    m = plan.max_chunk_size
    c = min(range(5), key=lambda k: plan.nodes[k].numel())
    n = plan.nodes[c].numel()
    assert n < m, "the test needs a padded chunk"
    h = plan.pad(cora.x)[c * m: (c + 1) * m].clone()
    clean = stage(h.clone(), chunk_id=torch.tensor([c]))
    h[n:] = float("nan")
    dirty = stage(h, chunk_id=torch.tensor([c]))
    assert torch.equal(clean, dirty)
    assert bool((dirty[n:] == 0).all())


def test_padding_rows_never_reach_the_loss(cora):
    torch.manual_seed(0)
    gnn = GCN(cora.num_features, 16, 2, 7)
    plan, (stage,) = make_stages(gnn, cora, num_chunks=5, num_stages=1)
    loss = PipelineLoss(stage.graph, cora.num_nodes, "deferred")
    seen = {}

    def full_loss(full):
        seen["full"] = full
        return full[cora.train_mask].sum(), None

    loss.reset(full_loss=full_loss)
    m = plan.max_chunk_size
    outs, proxies = [], []
    for c in range(plan.num_chunks):
        out = torch.full((m, 7), 1e6, requires_grad=True)  # padding rows hold huge values
        with torch.no_grad():
            out[: plan.nodes[c].numel()] = 1.0
        outs.append(out)
        proxies.append(loss(out, torch.tensor([c])))
    for p in proxies:  # GPipe order: every forward, then every backward
        p.backward()
    assert bool((seen["full"] == 1.0).all())  # no padding value reached the loss
    for c, out in enumerate(outs):
        n = plan.nodes[c].numel()
        assert bool((out.grad[n:] == 0).all())
        assert torch.equal(out.grad[:n], cora.train_mask[plan.nodes[c]].float()[:, None].expand(n, 7))


def test_user_modules_are_not_mutated(cora):
    gnn = GCN(cora.num_features, 16, 2, 7)
    before = {k: v.clone() for k, v in gnn.state_dict().items()}
    _, (stage,) = make_stages(gnn, cora, num_chunks=4, num_stages=1)
    stage.forward_full(cora.x)
    for conv in gnn.convs:
        assert conv.normalize and "forward" not in conv.__dict__
    assert all(torch.equal(before[k], v) for k, v in gnn.state_dict().items())


def test_gcnii_carries_h0_through_stages(cora):
    from lightning_gnnpipe.nn.gcnii import GCNII

    torch.manual_seed(0)
    model = GCNII(cora.num_features, 32, 7, num_layers=6).eval()
    plan, stages = make_stages(model, cora, num_chunks=4, num_stages=3)
    assert [s.carry_x0 for s in stages] == [True] * 3
    assert [len(s.input_widths) for s in stages] == [1, 2, 2] and [len(s.output_widths) for s in stages] == [2, 2, 1]
    out = (cora.x,)
    for stage in stages:
        out = stage.forward_full(*out, write_history=True)
        out = out if isinstance(out, tuple) else (out,)
    expected = model(cora.x, cora.edge_index)
    torch.testing.assert_close(out[0], expected, atol=1e-5, rtol=1e-5)
    m = plan.max_chunk_size
    x_pad = plan.pad(cora.x)
    chunked = torch.zeros_like(expected)
    for c in range(plan.num_chunks):  # chunked forward with fresh tables
        h = (x_pad[c * m: (c + 1) * m],)
        for stage in stages:
            h = stage(*h, chunk_id=torch.tensor([c]))
            h = h if isinstance(h, tuple) else (h,)
        chunked[plan.nodes[c]] = h[0][: plan.nodes[c].numel()]
    torch.testing.assert_close(chunked, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("x0_here", [False, True])
def test_stages_hand_their_rows_over_in_chunk_order(cora, x0_here):
    """Stages of one plan may pass the rows (``h``, and ``x0`` unless each stage computes it, ``x0_here``) in its chunk
    order: the same logits and tables, bit for bit, and each intermediate output is the node-order one's rows in chunk
    order."""
    from lightning_gnnpipe.nn.gcnii import GCNII

    torch.manual_seed(0)
    model = GCNII(cora.num_features, 32, 7, num_layers=6).eval()
    # x0_here: every later stage computes x0 from the features with block 0, as the strategy's ranks do
    _, stages = make_stages(model, cora, num_chunks=4, num_stages=3, sparse=True,
                            x0_block=model.blocks[0] if x0_here else None)
    order, _ = stages[0].runner.chunk_order()
    runs = []
    for ordered in (False, True):
        for stage in stages:
            for table in stage.histories.values():
                table.reset()
        out, middle = (cora.x,), []
        for i, stage in enumerate(stages):
            flags = (ordered and i > 0, ordered and i < len(stages) - 1)
            out = stage.forward_full(*out, write_history=True, chunk_order=flags)
            out = out if isinstance(out, tuple) else (out,)
            middle.append(out)
        tables = [t.emb.clone() for stage in stages for t in stage.histories.values()]
        runs.append((out[0], middle, tables))
    (plain, plain_middle, plain_tables), (moved, moved_middle, moved_tables) = runs
    assert torch.equal(moved, plain)
    torch.testing.assert_close(plain, model(cora.x, cora.edge_index), atol=1e-5, rtol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(moved_tables, plain_tables)) and len(plain_tables) == 6
    for a, b in zip(moved_middle[:-1], plain_middle[:-1]):  # h (and x0) of stages 0 and 1
        assert len(a) == (1 if x0_here else 2) and all(torch.equal(x, y[order]) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="every chunk"):
        stages[0].runner.__class__(stages[0].runner.blocks, stages[0].runner.layer_ids, stages[0].graph, x=cora.x,
                                   chunks=[0]).run_full(cora.x, None, 0, chunk_order=(True, False))


@pytest.mark.parametrize("name", ["gcn", "sage", "gin"])
def test_sparse_and_edge_list_stages_give_equal_outputs_and_gradients(cora, name):
    """A stage on CSR adjacencies computes what the edge-list stage computes: the chunked forward (with halo rows
    read from the tables) within 1e-5, and every parameter's gradient within 5e-5 of its largest entry (float32 sums
    over Cora's 2,708 nodes in another order: up to 2e-5 of it on some CPUs)."""
    make = MODELS[name]
    results = []
    for sparse in (False, True):
        torch.manual_seed(0)
        gnn = make(cora.num_features, 7).eval()
        plan, stages = make_stages(gnn, cora, num_chunks=4, num_stages=2, sparse=sparse)
        assert all(caller.sparse == sparse for st in stages for caller in st.runner.callers)
        out = refreshed_chunked_forward(plan, stages, cora.x)
        weight = torch.linspace(-1, 1, out.numel()).view_as(out)  # a loss whose gradient differs per entry
        (out * weight).sum().backward()
        results.append((out.detach(), [p.grad.clone() for p in gnn.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-5, rtol=1e-5)
    for sparse_grad, edge_grad in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(sparse_grad, edge_grad, atol=5e-5 * float(edge_grad.abs().max()), rtol=0)


@pytest.mark.parametrize("sparse", [False, True])
def test_activation_checkpointing_leaves_the_sgd_step_identical(cora, sparse):
    """Recomputing every block in the backward pass (dropout on, so the RNG replay matters) gives bit-identical
    outputs, gradients and parameters after one plain SGD step."""
    results = []
    for recompute in (False, True):
        torch.manual_seed(0)
        gnn = GCN(cora.num_features, 32, 4, 7, dropout=0.5).train()
        plan, stages = make_stages(gnn, cora, num_chunks=4, num_stages=2, sparse=sparse,
                                   activation_checkpointing=recompute)
        for stage in stages:
            stage.train()
        torch.manual_seed(1)
        out = refreshed_chunked_forward(plan, stages, cora.x)
        loss = torch.nn.functional.cross_entropy(out[cora.train_mask], cora.y[cora.train_mask])
        loss.backward()
        with torch.no_grad():
            for p in gnn.parameters():
                p -= 0.5 * p.grad
        results.append((out.detach(), [p.detach().clone() for p in gnn.parameters()]))
    assert torch.equal(results[0][0], results[1][0])
    for a, b in zip(results[0][1], results[1][1]):
        assert torch.equal(a, b)


def test_tables_keep_the_boundary_rows_only_and_compute_the_same(cora):
    """On Cora cut into 8 chunks a quarter of the nodes are another chunk's halo: the tables keep those rows alone
    (and a row map), and the chunked forward with stale tables equals the one with full tables bit for bit."""
    import lightning_gnnpipe.pipeline.stage as stage_module

    torch.manual_seed(0)
    gnn = MODELS["gcn"](cora.num_features, 7).eval()
    plan, lean = make_stages(gnn, cora, num_chunks=8, num_stages=2, sparse=True)
    boundary = torch.cat(plan.halo).unique()
    assert boundary.numel() < 0.3 * cora.num_nodes
    for stage in lean:
        for table in stage.histories.values():
            assert torch.equal(table.node_ids, boundary) and table.emb.size(0) == boundary.numel()
    full_rows = stage_module.BOUNDARY_ROWS
    try:
        stage_module.BOUNDARY_ROWS = 0.0  # never a row map: every node has a row
        _, full = make_stages(gnn, cora, num_chunks=8, num_stages=2, sparse=True)
    finally:
        stage_module.BOUNDARY_ROWS = full_rows
    assert all(t.emb.size(0) == cora.num_nodes for s in full for t in s.histories.values())
    torch.manual_seed(1)
    noise = torch.randn_like(cora.x)
    outs = []
    for stages in (lean, full):
        h = noise  # historical rows: the tables hold another input's embeddings
        for stage in stages:
            h = stage.forward_full(h, write_history=True)
        m, x_pad = plan.max_chunk_size, plan.pad(cora.x)
        out = torch.zeros(cora.num_nodes, 7)
        for c in range(plan.num_chunks):  # fresh rows for earlier chunks (pushed), historical for later ones
            h = x_pad[c * m: (c + 1) * m]
            for stage in stages:
                h = stage(h, chunk_id=torch.tensor([c]))
            out[plan.nodes[c]] = h[: plan.nodes[c].numel()]
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    assert not torch.allclose(outs[0], refreshed_chunked_forward(plan, full, cora.x))  # the historical rows mattered


def test_intra_op_threads_sets_and_restores():
    """The exact forward's stage compute takes the cores of the stages that wait (``eval_threads``)."""
    from lightning_gnnpipe.pipeline.runtime import intra_op_threads

    before = torch.get_num_threads()
    with intra_op_threads(before + 1):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before
    with intra_op_threads(None):
        assert torch.get_num_threads() == before


def _fork_child_threads(queue) -> None:
    from lightning_gnnpipe.pipeline.runtime import intra_op_threads

    a = torch.randn(600, 600)
    torch.set_num_threads(1)
    with intra_op_threads(2):
        queue.put(torch.get_num_threads())
        (a @ a).sum()  # a team of 2 after the fork would hang here
    queue.put("done")


def test_intra_op_threads_never_grows_the_team_of_a_forked_process():
    """GNU OpenMP hangs in the first parallel region of a larger team after a fork: a forked rank keeps its count."""
    import multiprocessing as mp

    torch.set_num_threads(2)
    a = torch.randn(600, 600)
    (a @ a).sum()  # the parent's OpenMP team exists before the fork
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_fork_child_threads, args=(queue,))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0, "the forked child hung or failed"
    assert queue.get(timeout=5) == 1 and queue.get(timeout=5) == "done"


def test_swapped_forward_puts_back_an_instance_forward_set_before():
    """The stack's forward swapped for a step (and a conv's for a chunk) comes back as it was, an instance
    forward set by the user included; without one, the class's forward runs again."""
    from torch_geometric.nn import GCNConv

    from lightning_gnnpipe.nn.forward_swap import swapped_forward
    from lightning_gnnpipe.strategy.forward_patch import stack_returns

    conv = GCNConv(3, 2)
    x, ei = torch.randn(4, 3), torch.tensor([[0, 1, 2], [1, 2, 3]])
    plain = conv(x, ei)
    mine = lambda x, edge_index: x.sum()  # noqa: E731  (a user's own instance forward)
    conv.forward = mine
    batch = type("Batch", (), {"x": x, "edge_index": ei})()
    with stack_returns(conv, torch.ones(4, 2), batch):
        assert torch.equal(conv(x, ei), torch.ones(4, 2))
    assert conv.forward is mine
    del conv.forward
    with swapped_forward([(conv, lambda *a: None)]):
        with pytest.raises(ZeroDivisionError):
            with swapped_forward([(conv, lambda *a: 1 / 0)]):
                conv(x, ei)
        assert conv(x, ei) is None
    assert "forward" not in conv.__dict__ and torch.equal(conv(x, ei), plain)
