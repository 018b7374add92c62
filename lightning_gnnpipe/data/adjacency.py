"""A chunk's local edges as ``torch.sparse_csr`` matrices, for sparse-dense aggregation.

A chunk's block runs on local rows ``x_local = cat([h_inner, h_halo])`` (``n_local = n_inner + n_halo`` rows) with
local edges ``edge_index`` ``(2, E_c)`` that all point into inner nodes (targets ``< n_inner``). Aggregating over
those edges is the product ``adj_t @ x_local`` with the chunk's adjacency ``adj_t`` ``(n_inner, n_local)``, rows =
inner targets, columns = local sources (PyG's ``adj_t`` convention: entry ``(i, j)`` is the weight of edge
``j -> i``). One sparse-dense matmul replaces the per-edge messages ``(E_c, d)`` of the edge-list path and their
gather/scatter: on CPU, one chunk of a 200k-node, average-degree-20 graph aggregates forward and backward several
times faster (numbers in :mod:`lightning_gnnpipe.nn.sparse`).

:class:`ChunkAdjacency` holds the CSR structure of one chunk, built once in ``O(E_c)`` memory (two stable sorts of
``E_c`` integer keys), and hands out :class:`SparseAdjacency` operators (values for sum or mean aggregation, or for
given edge weights, in the features' dtype), which it caches. An operator keeps both ``adj_t`` and its transpose
``adj`` ``(n_local, n_inner)`` as CSR, so that the backward pass of ``adj_t @ x`` is the CSR product ``adj @ grad``
(autograd of ``torch.sparse.mm`` transposes ``adj_t`` on every backward pass: forward and backward 1.5x to 3.8x
slower on CPU).

Multi-edges are kept as separate entries (no coalescing), so a duplicated edge counts twice in a sum *and* in the
degree of a mean, exactly as in the edge-list path. (``torch_geometric.utils.to_torch_csr_tensor`` coalesces: it
merges duplicates by summing their values, which changes a mean.)

Determinism. On CUDA, ``adj_t @ x`` is cuSPARSE's SpMM, which torch does not list among the kernels that
``torch.use_deterministic_algorithms(True)`` makes deterministic (torch 2.13). With that switch on (or
``Trainer(deterministic=True)``), CUDA products here take :func:`deterministic_matmul` instead: the entries'
products gathered ``(E_c, d)`` and summed per row with ``index_add_``, which torch runs deterministically in that
mode, at the edge-list path's memory. On the CPU the CSR product is deterministic already and is always used.
"""

from __future__ import annotations

import warnings
from typing import Dict, Mapping, Optional, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["ChunkAdjacency", "SparseAdjacency", "build_adjacency", "build_chunk_adjacency", "csr_matmul",
           "deterministic_matmul", "to_adj_t"]


def _csr(crow: Tensor, col: Tensor, values: Tensor, size: Tuple[int, int]) -> Tensor:
    with warnings.catch_warnings():  # torch warns once per process that sparse CSR is "in beta state"
        warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta state.*")
        return torch.sparse_csr_tensor(crow, col, values, size, check_invariants=False)


def deterministic_matmul(a: Tensor, x: Tensor) -> Tensor:
    """``a @ x`` for a ``torch.sparse_csr`` ``a`` ``(n, m)`` as a gather and a row-wise ``index_add_``.

    Deterministic on CUDA under ``torch.use_deterministic_algorithms(True)`` (torch's ``index_add`` then is); no host
    sync (the row of every entry comes from ``repeat_interleave`` with a known output size).

    Shapes:
        ``x`` ``(m, d)`` -> ``(n, d)``; ``E`` entries of ``a`` take ``E x d`` values of scratch memory.
    """
    crow, col, values = a.crow_indices(), a.col_indices(), a.values()
    rows = torch.repeat_interleave(torch.arange(a.size(0), device=x.device, dtype=crow.dtype), crow.diff(),
                                   output_size=col.numel())
    return x.new_zeros(a.size(0), x.size(1)).index_add_(0, rows, x.index_select(0, col) * values.unsqueeze(1))


def csr_matmul(a: Tensor, x: Tensor) -> Tensor:
    """``a @ x``: cuSPARSE / the CPU kernel, or :func:`deterministic_matmul` on CUDA in deterministic mode."""
    if x.is_cuda and torch.are_deterministic_algorithms_enabled():
        return deterministic_matmul(a, x)
    return a @ x


class _AdjMatmul(torch.autograd.Function):
    """``adj_t @ x`` whose backward pass is ``adj @ grad`` with the precomputed CSR transpose ``adj``."""

    # Outside autocast: it would cast a float32 product to bfloat16, which torch 2.13's CPU CSR matmul lacks, and the
    # edge-list path aggregates in float32 under autocast as well.

    @staticmethod
    def forward(ctx, x: Tensor, adj_t: Tensor, adj: Tensor) -> Tensor:  # type: ignore[override]
        ctx.adj = adj
        with torch.autocast(x.device.type, enabled=False):
            return csr_matmul(adj_t, x)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        with torch.autocast(grad.device.type, enabled=False):
            return csr_matmul(ctx.adj, grad.to(ctx.adj.dtype)), None, None


class SparseAdjacency:
    """A chunk's adjacency with fixed values, as ``adj_t`` and its transpose ``adj``, both ``torch.sparse_csr``.

    Attributes:
        adj_t: ``(n_inner, n_local)``; entry ``(i, j)`` is the weight of local edge ``j -> i``.
        adj: ``(n_local, n_inner)``, the transpose of ``adj_t`` (used in the backward pass).
        n_inner: Rows of ``adj_t`` (the chunk's inner nodes).
        n_local: Columns of ``adj_t`` (inner then halo rows).
    """

    def __init__(self, adj_t: Tensor, adj: Tensor) -> None:
        self.adj_t, self.adj = adj_t, adj
        self.n_inner, self.n_local = int(adj_t.size(0)), int(adj_t.size(1))

    @property
    def dtype(self) -> torch.dtype:
        return self.adj_t.dtype

    def matmul(self, x: Tensor) -> Tensor:
        """Aggregate: ``adj_t @ x``, differentiable in ``x`` (not in the adjacency values).

        Args:
            x: Local rows ``(n_local, d)``, of the adjacency's dtype and device.

        Returns:
            ``(n_inner, d)``.

        Raises:
            ValueError: ``x`` is not ``(n_local, d)`` or its dtype differs from the adjacency's.
        """
        if x.dim() != 2 or x.size(0) != self.n_local:
            raise ValueError(f"SparseAdjacency.matmul: expected x of shape ({self.n_local}, d) "
                             f"(got {tuple(x.shape)}).")
        if x.dtype != self.dtype:
            raise ValueError(f"SparseAdjacency.matmul: x has dtype {x.dtype}, the adjacency {self.dtype}. "
                             "Build the operator in the features' dtype (ChunkAdjacency.operator(dtype=x.dtype)).")
        return _AdjMatmul.apply(x, self.adj_t, self.adj)

    __matmul__ = matmul

    def square_adj_t(self) -> Tensor:
        """Return ``adj_t`` padded with empty halo rows, ``(n_local, n_local)`` ``torch.sparse_csr``.

        Shares column indices and values with ``adj_t``. For code that needs one output row per local row (a PyG conv
        called with ``adj_t`` in place of ``edge_index`` then returns ``(n_local, d)``, halo rows aggregating nothing).
        """
        crow = self.adj_t.crow_indices()
        pad = crow[-1:].expand(self.n_local - self.n_inner)
        return _csr(torch.cat([crow, pad]), self.adj_t.col_indices(), self.adj_t.values(),
                    (self.n_local, self.n_local))


class ChunkAdjacency:
    """CSR structure of one chunk's local edges (rows = inner targets), with cached value operators.

    Build it with :func:`build_adjacency`. All index tensors have one dtype (``index_dtype``).

    Attributes:
        crow: Row pointers ``(n_inner + 1,)``.
        col: Local source id of every entry, grouped by target row ``(E_c,)``; within a row, entries keep the
            order of the edges in ``edge_index``.
        perm: Edge id (column of ``edge_index``) of every entry ``(E_c,)``; ``None`` once :meth:`compact`.
        t_crow: Row pointers of the transpose ``(n_local + 1,)`` (rows = local sources).
        t_col: Inner target id of every entry of the transpose ``(E_c,)``.
        t_perm: Position in ``col`` of every entry of the transpose ``(E_c,)``; ``None`` once :meth:`compact`.
        weight: Per-edge weights in edge order ``(E_c,)`` (for example full-graph ``gcn_norm`` coefficients), or
            ``None`` for weight 1.
        n_inner: Inner nodes (rows).
        n_local: Local rows, inner then halo (columns).
    """

    def __init__(self, crow: Tensor, col: Tensor, perm: Tensor, t_crow: Tensor, t_col: Tensor, t_perm: Tensor,
                 n_inner: int, n_local: int, weight: Optional[Tensor] = None) -> None:
        self.crow, self.col, self.perm = crow, col, perm
        self.t_crow, self.t_col, self.t_perm = t_crow, t_col, t_perm
        self.n_inner, self.n_local = int(n_inner), int(n_local)
        self.weight = weight
        self._cache: Dict[Tuple[bool, torch.dtype], SparseAdjacency] = {}

    @property
    def num_edges(self) -> int:
        return int(self.col.numel())

    @property
    def device(self) -> torch.device:
        return self.col.device

    def degree(self) -> Tensor:
        """In-degree of every inner row, multi-edges counted ``(n_inner,)``, ``index_dtype``."""
        return self.crow[1:] - self.crow[:-1]

    def to(self, device) -> "ChunkAdjacency":
        """Return a copy on ``device`` (cached operators are not carried)."""
        if self.perm is None:
            raise RuntimeError("ChunkAdjacency.to: a compacted adjacency cannot be moved; move it before compact().")
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        return ChunkAdjacency(mv(self.crow), mv(self.col), mv(self.perm), mv(self.t_crow), mv(self.t_col),
                              mv(self.t_perm), self.n_inner, self.n_local, mv(self.weight))

    def operator(self, dtype: torch.dtype = torch.float32, mean: bool = False,
                 edge_weight: Optional[Tensor] = None) -> SparseAdjacency:
        """Return the operator for sum (or mean) aggregation over the chunk's edges, with values of ``dtype``.

        Entry values are ``w_e`` (``edge_weight`` if given, else :attr:`weight`, else 1), divided by the target's
        in-degree (number of entries of its row) when ``mean``: ``adj_t @ x`` is then
        ``sum_e w_e x_src`` (or ``mean_e w_e x_src``, 0 for a row without entries), as the edge-list aggregation.
        Operators without ``edge_weight`` are cached per ``(mean, dtype)``.

        Args:
            dtype: Value dtype, the features' dtype.
            mean: Divide by the in-degree.
            edge_weight: Per-edge weights in the order of the ``edge_index`` the structure was built from
                ``(E_c,)``; not differentiated through.

        Raises:
            ValueError: ``edge_weight`` is not ``(E_c,)``.
        """
        key = (bool(mean), dtype)
        if edge_weight is None and key in self._cache:
            return self._cache[key]
        if self.perm is None:
            raise RuntimeError(
                f"ChunkAdjacency.operator: this adjacency was compacted (ChunkAdjacency.compact) and keeps only the "
                f"operators {sorted((m, str(d)) for m, d in self._cache)} (mean, dtype); got mean={bool(mean)}, "
                f"dtype={dtype}, edge_weight={'given' if edge_weight is not None else None}. Build the chunk graph "
                "without compaction for convs that need other aggregation values.")
        weight = self.weight if edge_weight is None else edge_weight
        if weight is not None and tuple(weight.shape) != (self.num_edges,):
            raise ValueError(f"ChunkAdjacency.operator: edge weights must have shape ({self.num_edges},) "
                             f"(got {tuple(weight.shape)}).")
        if weight is None:
            values = torch.ones(self.num_edges, dtype=dtype, device=self.device)
        else:
            values = weight.detach().to(device=self.device, dtype=dtype).index_select(0, self.perm)
        if mean:
            deg = self.degree()
            values = values / deg.repeat_interleave(deg).to(dtype)
        op = SparseAdjacency(_csr(self.crow, self.col, values, (self.n_inner, self.n_local)),
                             _csr(self.t_crow, self.t_col, values.index_select(0, self.t_perm),
                                  (self.n_local, self.n_inner)))
        if edge_weight is None:
            self._cache[key] = op
        return op

    def clear_cache(self) -> None:
        """Drop the cached operators (their value arrays)."""
        if self.perm is None:
            raise RuntimeError("ChunkAdjacency.clear_cache: a compacted adjacency cannot rebuild its operators.")
        self._cache.clear()

    def compact(self, dtype: torch.dtype = torch.float32, means: Tuple[bool, ...] = (False,)) -> "ChunkAdjacency":
        """Build the operators ``(mean, dtype)`` for every ``mean`` in ``means``, then drop what only building other
        operators needs: :attr:`perm`, :attr:`t_perm` and :attr:`weight` (three ``(E_c,)`` arrays, 12 bytes per
        entry with ``int32`` indices and ``float32`` weights). Afterwards :meth:`operator` returns the cached operators
        and raises ``RuntimeError`` for any other request (another dtype or ``mean``, or given ``edge_weight``).

        Returns:
            ``self``.
        """
        for mean in means:
            self.operator(dtype, mean)
        self.perm = self.t_perm = self.weight = None
        return self


def _row_pointers(rows_sorted: Tensor, n_rows: int) -> Tensor:
    crow = torch.zeros(n_rows + 1, dtype=torch.int64, device=rows_sorted.device)
    torch.cumsum(torch.bincount(rows_sorted, minlength=n_rows), 0, out=crow[1:])
    return crow


def build_adjacency(edge_index: Tensor, n_inner: int, n_local: int, edge_weight: Optional[Tensor] = None,
                    index_dtype: torch.dtype = torch.int64) -> ChunkAdjacency:
    """Build the CSR structure of a chunk's local edges, rows = inner targets, columns = local rows.

    Two stable sorts of ``E_c`` integer keys (by target for ``adj_t``, by source for its transpose) and two
    bincounts; memory: four index arrays of ``E_c`` entries (``col``, ``perm``, ``t_col``, ``t_perm``) and two row
    pointer arrays, no ``(E_c, d)`` tensor. ``int64`` indices by default; ``int32`` halves the index memory but was
    not faster on CPU (see :mod:`lightning_gnnpipe.nn.sparse`).

    Args:
        edge_index: Local edges ``(2, E_c)``, integer, source row first; targets in ``[0, n_inner)``, sources in
            ``[0, n_local)``.
        n_inner: Inner nodes of the chunk.
        n_local: Local rows (inner + halo), ``>= n_inner``.
        edge_weight: Optional per-edge weights ``(E_c,)`` stored as :attr:`ChunkAdjacency.weight` (e.g. full-graph
            ``gcn_norm`` coefficients).
        index_dtype: ``torch.int64`` or ``torch.int32``.

    Returns:
        The :class:`ChunkAdjacency`, on ``edge_index``'s device.

    Raises:
        ValueError: Bad shapes or dtypes, ``n_local < n_inner``, an edge whose target is not inner or whose source
            is not local, or ``E_c`` too large for ``int32``.
    """
    if edge_index.dim() != 2 or edge_index.size(0) != 2 or edge_index.is_floating_point():
        raise ValueError(f"build_adjacency: `edge_index` must be an integer tensor of shape (2, E_c) "
                         f"(got {edge_index.dtype}, {tuple(edge_index.shape)}).")
    if not 0 <= n_inner <= n_local:
        raise ValueError(f"build_adjacency: need 0 <= n_inner <= n_local (got n_inner={n_inner}, n_local={n_local}).")
    if index_dtype not in (torch.int64, torch.int32):
        raise ValueError(f"build_adjacency: `index_dtype` must be torch.int64 or torch.int32 (got {index_dtype}).")
    num_edges = edge_index.size(1)
    if edge_weight is not None and tuple(edge_weight.shape) != (num_edges,):
        raise ValueError(f"build_adjacency: `edge_weight` must have shape ({num_edges},) "
                         f"(got {tuple(edge_weight.shape)}).")
    if index_dtype == torch.int32 and max(num_edges, n_local) >= 2**31:
        raise ValueError(f"build_adjacency: {num_edges} edges / {n_local} rows do not fit int32 indices. "
                         "Use index_dtype=torch.int64.")
    src, dst = edge_index[0].to(torch.int64), edge_index[1].to(torch.int64)
    if num_edges:
        if int(dst.min()) < 0 or int(dst.max()) >= n_inner:
            raise ValueError(f"build_adjacency: every edge must point into an inner node, targets in [0, {n_inner}) "
                             f"(got [{int(dst.min())}, {int(dst.max())}]).")
        if int(src.min()) < 0 or int(src.max()) >= n_local:
            raise ValueError(f"build_adjacency: sources must be local rows in [0, {n_local}) "
                             f"(got [{int(src.min())}, {int(src.max())}]).")
    dst_sorted, perm = torch.sort(dst, stable=True)
    col = src.index_select(0, perm)
    crow = _row_pointers(dst_sorted, n_inner)
    col_sorted, t_perm = torch.sort(col, stable=True)
    t_col = dst_sorted.index_select(0, t_perm)
    t_crow = _row_pointers(col_sorted, n_local)
    del dst_sorted, col_sorted
    cast = lambda t: t.to(index_dtype)  # noqa: E731  (no copy for int64)
    return ChunkAdjacency(cast(crow), cast(col), cast(perm), cast(t_crow), cast(t_col), cast(t_perm),
                          n_inner, n_local, edge_weight)


def build_chunk_adjacency(
    edge_index: Tensor, n_inner: int, n_local: int,
    norm_edges: Optional[Mapping[Tuple[bool, bool], Tuple[Tensor, Tensor]]] = None,
    index_dtype: torch.dtype = torch.int64, raw: bool = True,
) -> Tuple[Optional[ChunkAdjacency], Dict[Tuple[bool, bool], ChunkAdjacency]]:
    """Build one chunk's raw adjacency and its full-graph-normalised ones, the arguments of
    :func:`~lightning_gnnpipe.nn.sparse.sparse_aggregation`.

    Args:
        edge_index: The chunk's local edges ``(2, E_c)`` (``ChunkGraph.edge_index[c]``).
        n_inner: Inner nodes of the chunk.
        n_local: Inner + halo rows.
        norm_edges: Per ``(improved, add_self_loops)``, the chunk's local full-graph ``gcn_norm`` edges and
            coefficients ``((2, E'_c), (E'_c,))`` (``ChunkGraph.norm_edges[c]``).
        index_dtype: ``torch.int64`` or ``torch.int32``.
        raw: Build the raw adjacency (else ``None``: every conv reads a normalised one).

    Returns:
        ``(adjacency, norm_adjacency)``.

    Raises:
        ValueError: As :func:`build_adjacency`.
    """
    adjacency = build_adjacency(edge_index, n_inner, n_local, index_dtype=index_dtype) if raw else None
    norm = {key: build_adjacency(ei, n_inner, n_local, ew, index_dtype=index_dtype)
            for key, (ei, ew) in (norm_edges or {}).items()}
    return adjacency, norm


def to_adj_t(edge_index: Tensor, n_inner: int, n_local: int, edge_weight: Optional[Tensor] = None,
             dtype: torch.dtype = torch.float32, square: bool = False,
             index_dtype: torch.dtype = torch.int64) -> Tensor:
    """Return a chunk's adjacency as one ``torch.sparse_csr`` ``adj_t`` (for a PyG conv's ``edge_index`` argument).

    Multi-edges are kept as separate entries. Prefer :func:`build_adjacency` and
    :meth:`ChunkAdjacency.operator` for training: autograd of ``adj_t @ x`` then uses a precomputed transpose.

    Args:
        edge_index: Local edges ``(2, E_c)``, targets in ``[0, n_inner)``, sources in ``[0, n_local)``.
        n_inner: Inner nodes.
        n_local: Local rows (inner + halo).
        edge_weight: Optional values ``(E_c,)``; 1 if ``None``.
        dtype: Value dtype (the features' dtype).
        square: Return ``(n_local, n_local)`` with empty halo rows instead of ``(n_inner, n_local)``.
        index_dtype: ``torch.int64`` or ``torch.int32``.

    Returns:
        ``(n_inner, n_local)`` (or ``(n_local, n_local)``) ``torch.sparse_csr`` tensor.

    Raises:
        ValueError: As :func:`build_adjacency`.
    """
    op = build_adjacency(edge_index, n_inner, n_local, edge_weight, index_dtype).operator(dtype)
    return op.square_adj_t() if square else op.adj_t
