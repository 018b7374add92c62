"""A chunk's local rows read in place from a layer's rows, for an exact forward without gathered copies.

A chunk's block normally gets its local rows ``[inner; halo]`` as one gathered tensor ``(n_local, d)``. In an exact
whole-graph forward that keeps a layer's rows in chunk order (:meth:`~lightning_gnnpipe.nn.chunk_runner.ChunkRunner.
run_full`), the chunk's inner rows are one slice ``rows[a:b]`` of the layer's rows ``(R, d)`` and its halo rows are
rows of the same tensor. :class:`PositionalRows` lets the sparse path
(:func:`~lightning_gnnpipe.nn.sparse.sparse_aggregation`) aggregate straight from ``rows``: the chunk's CSR adjacency
with its columns renamed to positions in ``rows`` (``(n_inner, R)``, the same row pointers and values) times
``rows``. The block is called with the slice ``rows[a:b]`` in place of its local rows, so neither the inner rows'
copy nor the halo rows' gather is made; a layer's sparse product reads the same rows as the single process's
whole-graph product. Same values as the gathered path: each output row sums the same products in the same order.

This needs every conv of the block to read the block's input rows unchanged (:func:`reads_block_input`), no
gradient (the renamed operator has no transpose), and a rectangular block (the conv returns the inner rows only).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch import Tensor, nn
from torch_geometric.nn import DeepGCNLayer

from lightning_gnnpipe._compat import has_forward_pre_hooks
from lightning_gnnpipe.data.adjacency import SparseAdjacency, _csr, csr_matmul
from lightning_gnnpipe.nn.gcnii import GCNIILayer
from lightning_gnnpipe.nn.stack import BasicGNNLayer

__all__ = ["PositionalRows", "reads_block_input"]


def reads_block_input(block: nn.Module) -> bool:
    """Return whether every conv of ``block`` gets the block's input rows unchanged, in its current mode.

    True for a :class:`~lightning_gnnpipe.nn.stack.BasicGNNLayer` (the conv comes first), a
    :class:`~lightning_gnnpipe.nn.gcnii.GCNIILayer` whose dropout is off (evaluation mode or ``p = 0``) and a PyG
    ``DeepGCNLayer`` other than ``block="res+"`` (which normalises and activates its input before the conv), none of
    whose modules has a forward pre-hook (one may hand a conv another input). Any other block gives ``False``; raises
    nothing.
    """
    if has_forward_pre_hooks(block):
        return False
    if type(block) is BasicGNNLayer:
        return True
    if type(block) is GCNIILayer:
        return not block.drop.training or float(getattr(block.drop, "p", 0.0)) == 0.0
    if type(block) is DeepGCNLayer:
        return block.block != "res+"
    return False


class PositionalRows:
    """Chunk ``c``'s local rows as positions in a layer's rows: inner rows ``rows[a:b]``, halo rows elsewhere.

    Args:
        rows: The layer's input rows ``(R, d)``, every local row of the chunk among them.
        a: First of the chunk's inner rows in ``rows``.
        positions: Each local row's position in ``rows`` ``(n_local,)``, int64; ``positions[:n_inner]`` is
            ``a, a + 1, ...``.
        cache: Renamed operators by the operator they come from, kept by the caller for one forward (a dict it
            drops after; each holds ``E_c`` indices).
        residual: For a ``"res+"`` ``DeepGCNLayer`` (:func:`~lightning_gnnpipe.nn.inner_rows.conv_input`): ``rows``
            are then its conv's input, computed once for every row, and ``residual`` the inner rows of the block's
            own input ``(n_inner, d)``, which its residual adds.

    Shapes:
        :attr:`inner` ``(n_inner, d)``; :meth:`matmul` ``-> (n_inner, d)``; :meth:`local` ``-> (n_local, d)``.
    """

    def __init__(self, rows: Tensor, a: int, positions: Tensor, n_inner: int,
                 cache: Dict[int, Tuple[Tensor, Tensor]], residual: Optional[Tensor] = None) -> None:
        self.rows, self.positions, self._cache, self.residual = rows, positions, cache, residual
        self.inner = rows[a: a + n_inner]

    def holds(self, x: object) -> bool:
        """Whether ``x`` is :attr:`inner` (the tensor the block was called with, or an alias of it)."""
        i = self.inner
        return isinstance(x, Tensor) and x.data_ptr() == i.data_ptr() and x.shape == i.shape \
            and x.stride() == i.stride() and x.dtype == i.dtype

    def local(self) -> Tensor:
        """The gathered local rows ``(n_local, d)``, for a conv that transforms them before aggregating."""
        return self.rows.index_select(0, self.positions)

    def matmul(self, op: SparseAdjacency) -> Tensor:
        """``op.adj_t @ local rows`` ``(n_inner, d)``, read from :attr:`rows` (the renamed operator is cached).

        Raises:
            RuntimeError: Called while autograd records (the renamed operator has no backward).
        """
        if torch.is_grad_enabled() and self.rows.requires_grad:
            raise RuntimeError("PositionalRows.matmul: the positional product has no backward; use it under "
                               "torch.no_grad() only.")
        adj_t = op.adj_t
        hit = self._cache.get(id(adj_t))
        if hit is None or hit[0] is not adj_t:
            crow, col = adj_t.crow_indices(), adj_t.col_indices()
            index = col.dtype if self.rows.size(0) < 2**31 else torch.int64  # a chunk's int32 may not hold a position
            renamed = _csr(crow.to(index), self.positions.index_select(0, col.long()).to(index), adj_t.values(),
                           (adj_t.size(0), self.rows.size(0)))
            hit = self._cache[id(adj_t)] = (adj_t, renamed)
        return csr_matmul(hit[1], self.rows.to(op.dtype))
