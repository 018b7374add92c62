"""Unit tests of the history tables (``History``) and of stale halo gradients (``HaloGradients``).

Every expectation is a hand computation on a few rows, written out as literal numbers (binary fractions where
float32 must be exact).
"""

import pytest
import torch

from lightning_gnnpipe.history.halo_grad import HaloGradients
from lightning_gnnpipe.history.history import History, drift_of
from lightning_gnnpipe.history.lifecycle import combine_drift


def rows(*values):
    return torch.tensor(values, dtype=torch.float32)


# ----------------------------------------------------------------------------------------------- History


def test_a_new_table_is_zero_non_persistent_and_without_grad():
    table = History(5, 3)
    assert table.emb.shape == (5, 3) and table.emb.dtype == torch.get_default_dtype()
    assert torch.equal(table.emb, torch.zeros(5, 3)) and not table.emb.requires_grad
    assert table.state_dict() == {}  # not checkpointed with the model's weights
    assert [name for name, _ in table.named_buffers()] == ["emb"]  # but moves with .to(device/dtype)


@pytest.mark.parametrize("momentum", [-0.1, 1.0, 1.5])
def test_momentum_outside_zero_one_is_refused(momentum):
    with pytest.raises(ValueError, match=r"`momentum` must be in \[0, 1\)"):
        History(3, 2, momentum=momentum)


def test_push_overwrites_rows_in_index_order_and_pull_reads_them_in_any_order():
    table = History(4, 2)
    table.push(torch.tensor([3, 0]), rows([1, 2], [3, 4]))
    assert torch.equal(table.emb, rows([3, 4], [0, 0], [0, 0], [1, 2]))
    table.push(torch.tensor([3]), rows([5, 6]))  # momentum 0: the new rows replace the old ones
    assert torch.equal(table.emb, rows([3, 4], [0, 0], [0, 0], [5, 6]))
    assert torch.equal(table.pull(torch.tensor([3, 1, 0])), rows([5, 6], [0, 0], [3, 4]))
    assert torch.equal(table.pull(torch.tensor([0, 3, 0, 0])), rows([3, 4], [5, 6], [3, 4], [3, 4]))  # repeats
    assert table.pull(torch.tensor([], dtype=torch.long)).shape == (0, 2)


def test_push_with_a_repeated_index_writes_one_of_the_rows():
    # A repeated row in one push has no defined winner (index_put without accumulate): either value, never a sum.
    table = History(2, 2)
    table.push(torch.tensor([1, 1]), rows([1, 2], [3, 4]))
    assert table.emb[1].tolist() in ([1, 2], [3, 4]) and table.emb[0].tolist() == [0, 0]


def test_momentum_push_is_m_old_plus_one_minus_m_new():
    # m = 0.9, from a zero row: 0.1 * [10, -20] = [1, -2]; then 0.9 * [1, -2] + 0.1 * [1, 2] = [1, -1.6].
    table = History(3, 2, momentum=0.9)
    table.push(torch.tensor([2]), rows([10, -20]))
    torch.testing.assert_close(table.emb, rows([0, 0], [0, 0], [1, -2]), atol=1e-6, rtol=0)
    table.push(torch.tensor([2, 0]), rows([1, 2], [5, 5]))  # row 0 was zero: 0.1 * [5, 5]
    torch.testing.assert_close(table.emb, rows([0.5, 0.5], [0, 0], [1, -1.6]), atol=1e-6, rtol=0)
    # from an exact refresh [4, 8]: 0.9 * [4, 8] + 0.1 * [-6, 2] = [3, 7.4] (1 - m would give [-5, 2.6])
    table.refresh(rows([0, 0], [4, 8], [0, 0]))
    table.push(torch.tensor([1]), rows([-6, 2]))
    torch.testing.assert_close(table.emb[1], rows(3, 7.4), atol=1e-6, rtol=0)


def test_momentum_push_in_float64_equals_the_hand_computation_exactly():
    table = History(2, 1, dtype=torch.float64, momentum=0.75)  # binary fractions: no rounding anywhere
    table.push(torch.tensor([0, 1]), rows([8], [-4]))
    table.push(torch.tensor([0]), rows([16]))
    assert table.emb.dtype == torch.float64
    assert table.emb[:, 0].tolist() == [0.75 * 0.25 * 8 + 0.25 * 16, 0.25 * -4] == [5.5, -1.0]


def test_push_detaches_and_casts_and_pull_returns_a_copy():
    table = History(3, 2, dtype=torch.float64)
    value = rows([1.5, 2.5]).requires_grad_(True) * 2  # part of an autograd graph
    table.push(torch.tensor([1]), value)
    assert table.emb.dtype == torch.float64 and not table.emb.requires_grad and table.emb.grad_fn is None
    assert table.emb[1].tolist() == [3.0, 5.0]
    pulled = table.pull(torch.tensor([1]))
    assert pulled.dtype == torch.float64 and not pulled.requires_grad
    pulled.add_(100)  # writing the pulled rows leaves the table alone
    assert table.emb[1].tolist() == [3.0, 5.0]


def test_push_in_bfloat16_averages_in_the_values_precision_and_rounds_once():
    """A narrow table (bfloat16: 8 significant bits, spacing 2^-7 in [1, 2)) rounds the moving average once, after
    it: m = 0.5 of the old row 1 and the value 1 + 2^-7 + 2^-10 is 1.00439..., which rounds to 1 + 2^-7. Rounding the
    value first (to 1 + 2^-7) would give 1 + 2^-8, a tie that rounds to 1."""
    table = History(1, 1, dtype=torch.bfloat16, momentum=0.5)
    table.refresh(rows([1.0]))
    table.push(torch.tensor([0]), rows([1 + 2 ** -7 + 2 ** -10]))
    assert table.emb.dtype == torch.bfloat16 and table.emb.item() == 1 + 2 ** -7
    table.push(torch.tensor([0]), rows([1 + 2 ** -10]))  # the value alone would round to 1
    assert table.emb.item() == 1 + 2 ** -7  # 0.5 (1 + 2^-7) + 0.5 (1 + 2^-10) = 1.0044: 1 + 2^-7 again


def test_the_table_lives_on_the_requested_device_and_follows_module_to():
    assert History(2, 2, device="meta").emb.device.type == "meta"
    table = History(2, 2, device="cpu")
    table.push(torch.tensor([0]), rows([1, 2]))
    table.to(torch.float64)
    assert table.emb.dtype == torch.float64 and table.emb[0].tolist() == [1.0, 2.0]


def test_refresh_overwrites_every_row_and_returns_the_relative_drift():
    table = History(2, 2, momentum=0.9)  # a refresh is exact: it ignores the momentum
    table.push(torch.tensor([0]), rows([30, 0]))  # row 0 = [3, 0]
    squares = table.refresh(rows([0, 4], [0, 0]))
    assert squares == pytest.approx((25.0, 16.0))  # ||[3, -4]||^2, ||[0, 4]||^2
    assert drift_of(squares) == pytest.approx(5 / 4)
    assert torch.equal(table.emb, rows([0, 4], [0, 0]))
    assert drift_of(table.refresh(rows([0, 4], [0, 0]))) == 0.0  # already exact
    assert drift_of(table.refresh(rows([0, 0], [0, 0]))) == 0.0  # zero target: drift 0 by convention, not 0 / 0
    assert torch.equal(table.emb, torch.zeros(2, 2))


@pytest.mark.parametrize("boundary", [False, True])
def test_refresh_reads_rows_in_another_order_through_their_positions(boundary):
    """A stage that keeps the rows in chunk order hands them over with each node's position (no reordering first)."""
    exact = torch.arange(12.0).view(6, 2)  # node v's row, in node order
    order = torch.tensor([4, 0, 5, 2, 1, 3])  # rows in chunk order: node order[i] at row i
    position = torch.empty_like(order)
    position[order] = torch.arange(6)
    ids = torch.tensor([1, 3, 4])
    row_of = torch.full((6,), -1, dtype=torch.long)
    row_of[ids] = torch.arange(3)

    def table() -> History:
        t = History(3 if boundary else 6, 2, **({"node_ids": ids, "row_of": row_of} if boundary else {}))
        t.emb.fill_(1.0)
        return t

    plain, moved = table(), table()
    assert moved.refresh(exact[order], position) == pytest.approx(plain.refresh(exact))
    assert torch.equal(moved.emb, plain.emb)
    assert torch.equal(plain.emb, exact[ids] if boundary else exact)


def test_reset_zeros_the_table():
    table = History(3, 2)
    table.push(torch.tensor([0, 2]), rows([1, 1], [2, 2]))
    table.reset()
    assert torch.equal(table.emb, torch.zeros(3, 2)) and table.emb.shape == (3, 2)


# ------------------------------------------------------------------------------------------ HaloGradients


def test_halo_gradient_tables_start_at_zero_and_are_not_checkpointed():
    grads = HaloGradients(4, 2)
    assert torch.equal(grads.collected, torch.zeros(4, 2)) and torch.equal(grads.applied, torch.zeros(4, 2))
    assert grads.state_dict() == {}


def collect(grads: HaloGradients, halo_rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``halo_rows`` as a new leaf whose gradient goes to ``grads.collector(index)`` (what a chunk's backward hands
    the collector: the gradient of its halo rows)."""
    leaf = halo_rows.detach().requires_grad_(True)
    leaf.register_hook(grads.collector(index))
    return leaf


def test_collect_sums_the_halo_rows_gradient_per_node_and_cuts_the_graph():
    grads = HaloGradients(4, 2)
    source = rows([1, 1], [1, 1], [1, 1]).requires_grad_(True)
    halo = collect(grads, source * 3, torch.tensor([2, 0, 2]))  # node 2 appears twice
    assert halo.is_leaf and halo.requires_grad and torch.equal(halo, rows([3, 3], [3, 3], [3, 3]))
    (halo * rows([1, 2], [3, 4], [5, 6])).sum().backward()
    assert torch.equal(grads.collected, rows([3, 4], [0, 0], [6, 8], [0, 0]))
    assert source.grad is None  # the halo's owner gets the gradient next epoch, not through this graph
    # a second chunk's halo adds to the same epoch's sums
    (collect(grads, rows([0, 0]), torch.tensor([2])) * rows([10, 10])).sum().backward()
    assert torch.equal(grads.collected, rows([3, 4], [0, 0], [16, 18], [0, 0]))
    assert torch.equal(grads.applied, torch.zeros(4, 2))  # nothing is applied in the epoch it was collected


def test_collect_casts_the_gradient_to_the_table_dtype():
    grads = HaloGradients(2, 1)
    halo = collect(grads, torch.tensor([[2.0]], dtype=torch.float64), torch.tensor([1]))
    (halo * 0.25).sum().backward()
    assert grads.collected.dtype == torch.float32 and grads.collected[:, 0].tolist() == [0.0, 0.25]


def test_applied_gradients_are_last_epochs_collected_ones_added_to_the_owners_gradient():
    grads = HaloGradients(3, 2)
    (collect(grads, rows([0, 0], [0, 0]), torch.tensor([0, 2])) * rows([1, 2], [3, 4])).sum().backward()

    def owner_grad(index, upstream):
        h = rows(*[[1.0, 1.0]] * len(index)).requires_grad_(True)
        out = grads.apply(h, torch.tensor(index))
        assert torch.equal(out, h.detach())  # the forward value is unchanged
        (out * upstream).sum().backward()
        return h.grad

    # epoch 0: nothing applied yet
    assert torch.equal(owner_grad([2, 0], rows([1, 1], [1, 1])), rows([1, 1], [1, 1]))
    grads.next_epoch()  # epoch 1: last epoch's sums are applied, collection starts over
    assert torch.equal(grads.applied, rows([1, 2], [0, 0], [3, 4]))
    assert torch.equal(grads.collected, torch.zeros(3, 2))
    assert torch.equal(owner_grad([2, 1, 0], rows([1, 1], [1, 1], [-1, 0])), rows([4, 5], [1, 1], [0, 2]))
    assert torch.equal(owner_grad([2, 2], rows([0, 0], [0, 0])), rows([3, 4], [3, 4]))  # per row, repeats too
    grads.next_epoch()  # epoch 2: nothing was collected in epoch 1, so nothing is applied
    assert torch.equal(grads.applied, torch.zeros(3, 2))


def test_applied_gradient_follows_the_gradient_dtype():
    grads = HaloGradients(1, 1)
    (collect(grads, rows([0]), torch.tensor([0])) * 0.5).sum().backward()
    grads.next_epoch()
    h = torch.tensor([[1.0]], dtype=torch.float64, requires_grad=True)
    (grads.apply(h, torch.tensor([0])) * 2).sum().backward()
    assert h.grad.dtype == torch.float64 and h.grad.item() == 2.5


def test_drift_of_a_hybrid_stage_covers_the_rows_of_every_partition():
    """The G ranks of a hybrid stage hold one layer's table for different rows: the logged drift is that of the
    whole table (their rows together), not the last rank's."""
    old = torch.tensor([[3.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    exact = torch.tensor([[0.0, 4.0], [1.0, 1.0], [2.0, 0.0]])
    parts = []
    for ids in (torch.tensor([0]), torch.tensor([1, 2])):  # partition 0 holds row 0, partition 1 rows 1 and 2
        row_of = torch.full((3,), -1, dtype=torch.long)
        row_of[ids] = torch.arange(ids.numel())
        table = History(3, 2, node_ids=ids, row_of=row_of)
        table.emb.copy_(old[ids])
        parts.append({3: table.refresh(exact)})
    whole = float((old - exact).norm() / exact.norm())  # sqrt(25 / 22)
    assert combine_drift(parts) == {3: pytest.approx(whole)}
    assert combine_drift(parts)[3] != pytest.approx(drift_of(parts[1][3]))


def test_fresh_gradients_are_the_ones_collected_when_the_owners_backward_runs():
    grads = HaloGradients(3, 2, fresh=True)
    assert not hasattr(grads, "applied")  # one table
    h = rows([1, 1], [1, 1]).requires_grad_(True)
    out = grads.apply(h, torch.tensor([2, 0]))  # the owner's forward runs before the others' backward...
    (collect(grads, rows([0, 0], [0, 0]), torch.tensor([0, 2])) * rows([1, 2], [3, 4])).sum().backward()
    (out * rows([1, 1], [1, 1])).sum().backward()  # ...and its backward after theirs: it gets their sums
    assert torch.equal(h.grad, rows([4, 5], [2, 3]))
    late = collect(grads, rows([0, 0]), torch.tensor([2]))  # after the owner's backward: never applied
    (late * rows([9, 9])).sum().backward()
    grads.next_epoch()
    assert torch.equal(grads.collected, torch.zeros(3, 2))


class _State:
    def __init__(self, fn):
        self.fn = fn


class _Trainer:
    def __init__(self, epoch=1, step=2, fn="fit", validating=True, sanity_checking=False, max_epochs=5,
                 epoch_end=True):
        from types import SimpleNamespace

        self.current_epoch, self.global_step, self.state = epoch, step, _State(fn)
        self.validating, self.sanity_checking, self.max_epochs = validating, sanity_checking, max_epochs
        self.fit_loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(
            is_last_batch=epoch_end)))


def test_a_validation_is_the_refresh_only_in_fit_before_a_due_epoch_in_full_precision():
    from lightning_gnnpipe.history.lifecycle import HistoryLifecycle

    def lifecycle(refresh_every=2, autocast=False):
        return HistoryLifecycle([], lambda **kw: None, refresh_every, autocast=autocast)

    assert lifecycle().refreshes_in_evaluation(_Trainer())  # after epoch 1: epoch 2 refreshes
    assert not lifecycle().refreshes_in_evaluation(_Trainer(epoch=0))  # epoch 1 does not
    assert not lifecycle(refresh_every=0).refreshes_in_evaluation(_Trainer())
    assert not lifecycle(autocast=True).refreshes_in_evaluation(_Trainer())
    assert not lifecycle().refreshes_in_evaluation(_Trainer(fn="validate"))  # trainer.validate(): no fit
    assert not lifecycle().refreshes_in_evaluation(_Trainer(sanity_checking=True))
    assert not lifecycle().refreshes_in_evaluation(_Trainer(max_epochs=2))  # no epoch 2 follows
    assert lifecycle().refreshes_in_evaluation(_Trainer(max_epochs=-1))  # no epoch limit
    assert not lifecycle().refreshes_in_evaluation(_Trainer(epoch_end=False))  # val_check_interval < 1: mid-epoch


@pytest.mark.parametrize("fresh", [False, True])
def test_gradient_tables_for_boundary_nodes_only_hand_the_same_gradients(fresh):
    """With a row map (rows for nodes 1 and 3 of 5) the tables are 3 rows (2 boundary nodes + a zero row), and the
    owner's gradient is the one of full ``(|V|, d)`` tables: nodes without a row get nothing added."""
    row_of = torch.tensor([-1, 0, -1, 1, -1])
    full, mapped = HaloGradients(5, 2, fresh=fresh), HaloGradients(5, 2, fresh=fresh, row_of=row_of)
    assert mapped.collected.shape == (3, 2)
    got = []
    for grads in (full, mapped):
        h = rows([1, 1], [1, 1], [1, 1], [1, 1]).requires_grad_(True)
        out = grads.apply(h, torch.tensor([3, 0, 1, 4]))  # nodes 0 and 4 have no row
        (collect(grads, rows([0, 0], [0, 0], [0, 0]), torch.tensor([3, 1, 3])) * rows([1, 2], [3, 4], [5, 6])).sum() \
            .backward()
        if not fresh:
            grads.next_epoch()
            out = grads.apply(h, torch.tensor([3, 0, 1, 4]))
        (out * rows([1, 1], [1, 1], [1, 1], [1, 1])).sum().backward()
        got.append(h.grad)
    assert torch.equal(got[0], got[1])
    assert torch.equal(got[1], rows([7, 9], [1, 1], [4, 5], [1, 1]))  # node 3: 1 + 1 + 5, node 1: 1 + 3
    assert torch.equal(mapped.collected[-1], torch.zeros(2))  # the zero row stays zero


def test_auto_refreshes_every_epoch_only_where_each_refresh_is_a_validation(caplog):
    """``refresh_every="auto"`` is 1 where the fit validates every epoch in full precision, else 0 with a line why;
    an int is kept."""
    import logging

    from lightning.pytorch import LightningModule, Trainer

    from lightning_gnnpipe.strategy.checks import resolve_refresh_every
    from tests.helpers import GCNModule

    class NoValidation(LightningModule):
        pass

    def trainer(**kw):
        t = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False, **kw)
        t.state.fn = "fit"
        return t

    module = GCNModule(16, 32, 4, 2)
    assert resolve_refresh_every("auto", trainer(), module) == 1
    assert resolve_refresh_every(0, trainer(), module) == 0 and resolve_refresh_every(3, trainer(), module) == 3
    with caplog.at_level(logging.INFO):
        assert resolve_refresh_every("auto", trainer(), NoValidation()) == 0
        assert resolve_refresh_every("auto", trainer(limit_val_batches=0), module) == 0
        assert resolve_refresh_every("auto", trainer(check_val_every_n_epoch=2), module) == 0
        assert resolve_refresh_every("auto", trainer(), module, autocast=True) == 0
    said = caplog.text
    for why in ("no validation_step", "limit_val_batches=0", "check_val_every_n_epoch=2", "bf16-mixed"):
        assert "refresh_every='auto' -> 0" in said and why in said


@pytest.mark.parametrize("value", ["always", -1, True, 1.0])
def test_a_bad_refresh_period_is_refused_with_the_value(value):
    from lightning_gnnpipe import GNNPipeStrategy

    with pytest.raises(ValueError, match=r"`refresh_every` must be 'auto' or an int >= 0 epochs \(got " + repr(value)):
        GNNPipeStrategy(refresh_every=value)


def test_auto_halo_gradients_are_fresh_only_where_the_tables_are_exact_and_the_order_allows():
    """``halo_gradients="auto"`` is ``"fresh"`` with exact tables at each epoch's start (refresh period 1), one
    pipeline and a schedule whose backwards follow the forwards' order; else ``"detach"``; a named value is kept."""
    from lightning_gnnpipe import GNNPipeStrategy
    from lightning_gnnpipe.strategy.checks import resolve_halo_gradients

    assert resolve_halo_gradients("auto", 1, "auto", 1) == "fresh"
    assert resolve_halo_gradients("auto", 1, "gpipe", 1) == "fresh"
    assert resolve_halo_gradients("auto", 1, "1f1b", 1) == "fresh"
    assert resolve_halo_gradients("auto", 0, "1f1b", 1) == "detach"  # historical tables
    assert resolve_halo_gradients("auto", 2, "1f1b", 1) == "detach"
    assert resolve_halo_gradients("auto", 1, "1f1b", 2) == "detach"  # hybrid
    assert resolve_halo_gradients("auto", 1, "interleaved_1f1b", 1) == "detach"  # multi-stage schedule
    assert resolve_halo_gradients("detach", 1, "1f1b", 1) == "detach"
    assert resolve_halo_gradients("stale", 0, "gpipe", 1) == "stale"
    # "auto" is accepted where a named "fresh" is refused
    GNNPipeStrategy(schedule="interleaved_1f1b", stages_per_rank=2)
    GNNPipeStrategy(graph_parallel_size=2)
    with pytest.raises(ValueError, match=r"halo_gradients='fresh'.*not supported with the multi-stage schedule"):
        GNNPipeStrategy(schedule="interleaved_1f1b", stages_per_rank=2, halo_gradients="fresh")
    with pytest.raises(ValueError, match=r"`halo_gradients` must be 'auto' or one of .* \(got 'always'\)"):
        GNNPipeStrategy(halo_gradients="always")


def test_auto_halo_gradients_are_detached_where_a_block_drops_out(caplog):
    """Dropout in a block (``nn.Dropout``, ``NodeDropout``, a conv's float ``dropout``) makes ``"auto"`` detach the
    halo rows' gradients (the tables hold rows computed without dropout), with a line naming the block in a fit."""
    import logging

    from torch import nn
    from torch_geometric.nn import GATConv

    from lightning_gnnpipe.nn import NodeDropout
    from lightning_gnnpipe.nn.dropout import first_dropout
    from lightning_gnnpipe.strategy.checks import resolve_halo_gradients

    plain = [nn.Linear(4, 4), nn.Sequential(nn.LayerNorm(4), nn.Dropout(0.0))]
    assert first_dropout(plain) is None and resolve_halo_gradients("auto", 1, "1f1b", 1, plain) == "fresh"
    for drop, where in ((nn.Dropout(0.5), "block 1 (1): Dropout(p=0.5)"), (NodeDropout(0.2), "NodeDropout(p=0.2)"),
                        (GATConv(4, 4, dropout=0.6), "GATConv(p=0.6)"), (nn.Dropout(1), "Dropout(p=1)")):
        blocks = [nn.Linear(4, 4), nn.Sequential(nn.LayerNorm(4), drop)]
        assert where in first_dropout(blocks)
        with caplog.at_level(logging.INFO):
            caplog.clear()
            assert resolve_halo_gradients("auto", 1, "1f1b", 1, blocks, fitting=True) == "detach"
        assert "halo_gradients='auto' -> 'detach'" in caplog.text and where in caplog.text
        assert resolve_halo_gradients("fresh", 1, "1f1b", 1, blocks) == "fresh"  # a named value is kept


class _FunctionalDropoutBlock(torch.nn.Module):
    """A user's block that drops out with ``F.dropout`` in ``forward`` (as docs/custom_models.md's ``ResGCNBlock``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, edge_index):
        # F.dropout( in a comment and "F.dropout(" in a string are not calls
        return self.lin(torch.nn.functional.dropout(x, 0.5, self.training))


class _InheritsFunctionalDropout(_FunctionalDropoutBlock):
    pass


class _ImportedDropoutBlock(torch.nn.Module):
    """Calls the functional dropout imported by its name."""

    def forward(self, x, edge_index):
        from torch.nn.functional import dropout

        return dropout(x, 0.5, self.training)


class _DropoutMethodBlock(torch.nn.Module):
    """A method named ``dropout`` (defined and called on ``self``) is not a call of the functional one."""

    def __init__(self) -> None:
        super().__init__()
        self.p = 0.0

    def dropout(self, x):
        return x * (1 - self.p)

    def forward(self, x, edge_index):
        return self.dropout(x)


class _NoDropoutBlock(torch.nn.Module):
    """Mentions F.dropout(x) only in its docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, edge_index):
        return self.lin(x)  # not F.dropout(x)


def test_auto_halo_gradients_see_a_functional_dropout_in_a_blocks_source():
    """A block of the user's own that calls ``F.dropout`` in ``forward`` (no dropout module, no ``dropout`` number to
    read) drops out too: ``"auto"`` detaches, naming the class (its base where the call is inherited); a call in a
    comment or string is not one, and torch's, PyG's and this package's modules are read from their attributes."""
    from torch import nn
    from torch_geometric.nn import GATConv, GCNConv

    from lightning_gnnpipe.nn.dropout import first_dropout
    from lightning_gnnpipe.strategy.checks import resolve_halo_gradients

    assert first_dropout([nn.Linear(4, 4), _FunctionalDropoutBlock()]) == \
        "block 1: _FunctionalDropoutBlock calls F.dropout"
    assert first_dropout([nn.Sequential(_InheritsFunctionalDropout())]) == \
        "block 0 (0): _InheritsFunctionalDropout (its base _FunctionalDropoutBlock) calls F.dropout"
    assert resolve_halo_gradients("auto", 1, "1f1b", 1, [_FunctionalDropoutBlock()]) == "detach"
    assert first_dropout([_ImportedDropoutBlock()]) == "block 0: _ImportedDropoutBlock calls F.dropout"
    assert first_dropout([_DropoutMethodBlock()]) is None
    off = _FunctionalDropoutBlock()
    off.dropout = 0.0  # a number of its own decides: no dropout, although its code calls F.dropout
    assert first_dropout([off]) is None and resolve_halo_gradients("auto", 1, "1f1b", 1, [off]) == "fresh"
    off.dropout = 0.3
    assert first_dropout([off]) == "block 0: _FunctionalDropoutBlock(p=0.3)"
    plain = [_NoDropoutBlock(), GCNConv(4, 4), GATConv(4, 4, dropout=0.0)]  # GATConv's source calls F.dropout
    assert first_dropout(plain) is None and resolve_halo_gradients("auto", 1, "1f1b", 1, plain) == "fresh"
