"""Historical embeddings: one table of every node's input embedding for one layer.

GNNPipe (arXiv 2308.10087, Sec. 4.2) reads a chunk's halo rows from such a table: *fresh* if
the halo's chunk already passed this layer in the current epoch, *historical* (written in the
previous epoch) otherwise. The push/pull names follow GNNAutoScale's ``History``
(Fey et al., ICML 2021, arXiv 2106.05609).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor, nn


class History(nn.Module):
    """Table of ``|V|`` rows (or of the rows of some nodes, ``node_ids``) of width ``channels``, zero until written.

    The table is a non-persistent buffer: it is not part of any ``state_dict`` and never
    requires grad; rows are copied in (``push``) and out (``pull``), so autograd never sees
    the in-place writes.

    Args:
        num_nodes: Rows ``|V|``.
        channels: Width ``d`` of the layer's input embedding.
        device: Device of the table (default: torch's default).
        dtype: Dtype of the table (default: torch's default). A narrower one than the embeddings' (``bfloat16``)
            halves the table's bytes; every row read from it is then rounded to that precision.
        momentum: Moving-average weight ``m`` of the old rows in :meth:`push`, in ``[0, 1)``
            (0: plain overwrite).
        node_ids: Only these nodes have rows (sorted global ids ``(R,)``; hybrid parallelism: a partition and its
            halo), with ``row_of`` ``(|V|,)`` their row (``-1`` elsewhere, shared by the tables of a stage);
            :meth:`push` and :meth:`pull` still take global ids. ``None``: every node has a row.

    Raises:
        ValueError: If ``momentum`` is not in ``[0, 1)``, or ``node_ids`` comes without ``row_of``.

    Shapes:
        ``emb``: ``(|V|, d)``, or ``(R, d)`` with ``node_ids``.
    """

    def __init__(self, num_nodes: int, channels: int, device=None, dtype=None, momentum: float = 0.0,
                 node_ids: Optional[Tensor] = None, row_of: Optional[Tensor] = None) -> None:
        super().__init__()
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"History: `momentum` must be in [0, 1) (got {momentum}). Use 0 for plain tables.")
        if (node_ids is None) != (row_of is None):
            raise ValueError("History: pass `node_ids` and `row_of` together (got only one of them).")
        self.momentum = momentum
        self.node_ids, self.row_of = node_ids, row_of
        rows = num_nodes if node_ids is None else int(node_ids.numel())
        self.register_buffer("emb", torch.zeros(rows, channels, device=device, dtype=dtype), persistent=False)

    def _rows(self, index: Tensor) -> Tensor:
        return index if self.row_of is None else self.row_of[index]

    @torch.no_grad()
    def push(self, index: Tensor, value: Tensor) -> None:
        """Write rows ``index`` ``(n,)`` with ``value`` ``(n, d)`` (detached).

        With ``momentum`` ``m > 0`` the rows become ``m * old + (1 - m) * value``: a moving average that
        smooths historical embeddings across epochs (PipeGCN, Wan et al., ICLR 2022, arXiv 2203.10428). The
        average is taken in ``value``'s dtype and rounded once to the table's.
        """
        value = value.detach()
        index = self._rows(index)
        if self.momentum > 0:  # in the value's precision, rounded to the table's once
            value = self.momentum * self.emb[index].to(value.dtype) + (1.0 - self.momentum) * value
        self.emb[index] = value.to(self.emb.dtype)

    def pull(self, index: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
        """Return a detached copy of rows ``index`` ``(n,)`` as ``(n, d)``, in ``dtype`` (default: the table's)."""
        return self.emb[self._rows(index)].to(dtype or self.emb.dtype)

    @torch.no_grad()
    def pull_into(self, index: Tensor, out: Tensor) -> Tensor:
        """Copy rows ``index`` ``(n,)`` into ``out`` ``(n, d)`` (cast to its dtype), without a second copy; return it."""
        rows = self._rows(index)
        if out.dtype == self.emb.dtype:
            return torch.index_select(self.emb, 0, rows, out=out)
        return out.copy_(self.emb[rows])

    @torch.no_grad()
    def refresh(self, value: Tensor, position: Optional[Tensor] = None) -> Tuple[float, float]:
        """Overwrite all rows with exact embeddings ``(|V|, d)``; return ``||old - value||^2`` and ``||value||^2``.

        Squared Frobenius norms over the table's rows, before the overwrite: the drift ``||old - value|| / ||value||``
        (unitless, :func:`drift_of`) measures how far the table had moved from the exact embeddings of the current
        weights; kept as sums so that tables holding different rows (the partitions of a hybrid stage) add up.

        Args:
            value: Every node's row ``(|V|, d)``, in node order, or in another order given by ``position``.
            position: Node ``v``'s row in ``value`` is ``value[position[v]]`` ``(|V|,)``; ``None``: ``value[v]``.
                Only the table's own rows are read, so a stage that keeps the rows in chunk order hands them over
                without putting all of them back in node order first.
        """
        index = self.node_ids if position is None else position if self.node_ids is None else position[self.node_ids]
        if index is not None:
            value = value.index_select(0, index)
        # one temporary of the table's size (the difference), as before; norms accumulated in float32
        diff = float(torch.linalg.vector_norm(self.emb - value, dtype=torch.float32))
        squares = (diff * diff, float(torch.linalg.vector_norm(value, dtype=torch.float32)) ** 2)
        self.emb.copy_(value)
        return squares

    @torch.no_grad()
    def refresh_rows(self, index: Tensor, value: Tensor) -> Tuple[float, float]:
        """:meth:`refresh` for some rows: overwrite the rows of nodes ``index`` ``(n,)`` with exact embeddings
        ``value`` ``(n, d)``; return ``||old - value||^2`` and ``||value||^2`` over them (the sums of disjoint parts
        that cover the table add up to :meth:`refresh`'s). Raises nothing: every node of ``index`` must have a row
        (a boundary node of a table that keeps boundary rows only); the caller's plan guarantees it."""
        rows = self._rows(index)
        diff = float(torch.linalg.vector_norm(self.emb.index_select(0, rows) - value, dtype=torch.float32))
        squares = (diff * diff, float(torch.linalg.vector_norm(value, dtype=torch.float32)) ** 2)
        self.emb.index_copy_(0, rows, value.to(self.emb.dtype))
        return squares

    @torch.no_grad()
    def reset(self) -> None:
        """Zero the table."""
        self.emb.zero_()


def drift_of(squares: Tuple[float, float]) -> float:
    """``||old - exact|| / ||exact||`` (unitless) from ``(sum ||old - exact||^2, sum ||exact||^2)`` of
    :meth:`History.refresh`, over one table or several added up; 0 when the exact rows are all zero, by convention.
    Raises nothing."""
    diff, norm = squares
    return (diff / norm) ** 0.5 if norm > 0 else 0.0
