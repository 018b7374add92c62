"""Halo gradients: what becomes of the gradients that reach a chunk's halo rows.

With detached halos (GNNAutoScale, Fey et al., ICML 2021) the gradient of the loss with respect to a chunk's halo
rows is dropped. PipeGCN (Wan et al., ICLR 2022, arXiv 2203.10428) keeps it and applies it one iteration late
(``"stale"``): here, the gradients that reach halo rows of layer ``l`` during epoch ``e`` are summed per node, and in
epoch ``e + 1`` they are added to the gradient of the owner chunk's input of layer ``l`` during its backward.

``"fresh"`` applies them in the same epoch where the order allows: the schedules run the chunks' backwards in the
order of their forwards (GPipe, 1F1B), so when chunk ``c`` runs its backward through layer ``l``, the chunks before
it have already sent theirs for ``c``'s rows, the rows they read historical (``c`` had not yet written them this
epoch). Those are added; the gradients of rows read fresh (by later chunks, after ``c``'s backward) are dropped. The
chunks then run in reverse order in odd epochs (:class:`~lightning_gnnpipe.pipeline.runtime.PipelineRuntime`), so
each cut edge's gradient is added every second epoch, in one direction one epoch and in the other the next. With
exact tables (``refresh_every=1``, one step per epoch) what is added is exactly the full-graph gradient along those
edges.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor, nn


HALO_GRADIENTS = ("detach", "stale", "fresh")
"""What a halo row's gradient does: ``"detach"`` (dropped, GNNPipe's default), ``"stale"`` (applied to its owner
one epoch later) or ``"fresh"`` (applied to its owner in the same epoch if its backward has not run yet, else
dropped; the chunk order alternates by epoch), :class:`HaloGradients`."""


def check_halo_gradients(value: object, owner: str) -> None:
    """Check a ``halo_gradients`` option before any process group starts.

    Raises:
        ValueError: ``value`` is not one of :data:`HALO_GRADIENTS` (the message names ``owner`` and the value).
    """
    if value not in HALO_GRADIENTS:
        raise ValueError(f"{owner}: `halo_gradients` must be one of {HALO_GRADIENTS} (got {value!r}).")


def _add_rows(grad: Tensor, positions: Optional[Tensor], extra: Tensor) -> Tensor:
    """``grad`` with ``extra`` added to its rows ``positions`` (all rows when ``None``), out of place."""
    extra = extra.to(grad.dtype)
    return grad + extra if positions is None else grad.index_add(0, positions, extra)


class _AddToGrad(torch.autograd.Function):
    """Identity whose backward adds ``extra`` to the rows ``positions`` of the gradient."""

    @staticmethod
    def forward(ctx, h: Tensor, extra: Tensor, positions: Optional[Tensor]) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(extra)
        ctx.positions = positions
        return h.view_as(h)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (extra,) = ctx.saved_tensors
        return _add_rows(grad, ctx.positions, extra), None, None


class _AddRowsAtBackward(torch.autograd.Function):
    """Identity whose backward adds the rows ``index`` of ``table`` as they are when the backward runs, to the rows
    ``positions`` of the gradient."""

    @staticmethod
    def forward(ctx, h: Tensor, table: Tensor, index: Tensor,  # type: ignore[override]
                positions: Optional[Tensor]) -> Tensor:
        ctx.table, ctx.index, ctx.positions = table, index, positions  # not saved: the table changes until then
        return h.view_as(h)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        return _add_rows(grad, ctx.positions, ctx.table[ctx.index]), None, None, None


class HaloGradients(nn.Module):
    """Per-node gradient tables of one layer's input: collected this epoch, applied next epoch (``fresh=False``) or
    at the owner chunk's backward in this one (``fresh=True``: one table, no ``applied``).

    Args:
        num_nodes: ``|V|``.
        channels: ``d``, the layer's input width.
        device: Device of the tables.
        fresh: Apply the gradients in the epoch they are collected in (one table).
        row_of: Table row of each node ``(|V|,)``, ``-1`` for a node that no chunk reads as a halo row (as the
            stage's history tables keep rows for the boundary nodes alone); the tables then hold one row per
            boundary node and one zero row that the other nodes read. Default: a row for every node.

    Shapes:
        ``collected``, ``applied``: ``(R + 1, d)`` with ``R`` boundary nodes, or ``(|V|, d)`` without ``row_of``.
    """

    def __init__(self, num_nodes: int, channels: int, device=None, fresh: bool = False,
                 row_of: Optional[Tensor] = None) -> None:
        super().__init__()
        self.fresh = fresh
        rows = num_nodes
        self.row_of: Optional[Tensor] = None
        if row_of is not None:  # nodes without a row (-1) read the last row, a zero one that nothing collects into
            rows = int(row_of.max()) + 2 if row_of.numel() else 1
            self.row_of = row_of  # the stage's, shared by its tables
        self.register_buffer("collected", torch.zeros(rows, channels, device=device), persistent=False)
        if not fresh:
            self.register_buffer("applied", torch.zeros(rows, channels, device=device), persistent=False)

    def _rows(self, index: Tensor) -> Tensor:
        return index if self.row_of is None else self.row_of[index]  # -1: the last row, the zero one

    def collector(self, index: Tensor) -> Callable[[Tensor], None]:
        """Return a function that sums a gradient ``(h, d)`` of the halo rows of nodes ``index`` ``(h,)`` (every one
        of them a boundary node: one that has a row) into their rows of ``collected``."""
        rows = self._rows(index)

        def collect(grad: Tensor) -> None:
            self.collected.index_add_(0, rows, grad.to(self.collected.dtype))

        return collect

    def apply(self, h: Tensor, index: Tensor, positions: Optional[Tensor] = None) -> Tensor:
        """Return ``h`` ``(n, d)`` whose backward also carries the gradient of nodes ``index``: last epoch's, or with
        ``fresh`` what has been collected for them when this backward runs.

        Args:
            h: Rows of the owner chunk ``(n, d)``.
            index: Node of each row of ``h`` ``(n,)``, or with ``positions`` of each of those rows ``(p,)``.
            positions: The rows of ``h`` that may have a gradient to add (its boundary nodes) ``(p,)``; ``None``: all.
        """
        rows = self._rows(index)
        if self.fresh:
            return _AddRowsAtBackward.apply(h, self.collected, rows, positions)
        return _AddToGrad.apply(h, self.applied[rows], positions)

    @torch.no_grad()
    def next_epoch(self) -> None:
        """Make this epoch's collected gradients the ones applied in the next epoch (``fresh``: drop them)."""
        if not self.fresh:
            self.applied.copy_(self.collected)
        self.collected.zero_()
