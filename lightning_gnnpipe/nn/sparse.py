"""Sparse-dense aggregation for a chunk's block: one CSR matmul instead of per-edge messages.

The edge-list path of a conv materialises one message per edge ``(E_c, d)`` and scatters it to the targets; convs
that aggregate by a (weighted) sum or mean can instead multiply the chunk's adjacency ``adj_t``
``(n_inner, n_local)`` (:mod:`lightning_gnnpipe.data.adjacency`) with the dense local rows. :func:`sparse_aggregation`
does that for one block call: the forward of every conv of the block is swapped for the call (restored after, as in
:func:`~lightning_gnnpipe.nn.gcn_norm.precomputed_norm`, which it replaces for that call), the user's block is
called unchanged, ``conv(x, edge_index)`` and all, and each conv computes what its edge-list forward computes for
the inner rows, through the adjacency:

* ``GCNConv(normalize=True)`` / ``GCN2Conv(normalize=True)``: the full-graph ``gcn_norm`` adjacency of the conv's
  ``(improved, add_self_loops)`` (its values include the self loops of the inner nodes, which are local edges of the
  normalised graph); the ``edge_index``/``edge_weight`` passed in are ignored, as ``precomputed_norm`` ignores them.
* ``GCNConv(normalize=False)``, ``GCN2Conv(normalize=False)``, ``GraphConv``: the raw adjacency, values 1 or the
  ``edge_weight`` passed in (aligned with the chunk's ``edge_index``).
* ``SAGEConv``, ``GINConv``, ``GraphConv``: the bipartite pair ``(x_local, x_local[:rows])``: the root/self term
  reads only the output rows.
* ``aggr="mean"`` divides each row's values by its in-degree (multi-edges counted), as the edge-list mean does.

**Which rows a conv returns.** *Rectangular* (``n_inner`` rows: halo rows are not computed at all) when the block's
code is known, a :class:`~lightning_gnnpipe.nn.stack.BasicGNNLayer` (our own wrapper of a PyG ``BasicGNN`` layer:
conv, then norm, activation, dropout; no residual), a :class:`~lightning_gnnpipe.nn.gcnii.GCNIILayer` or a PyG
``DeepGCNLayer`` (:mod:`~lightning_gnnpipe.nn.inner_rows` lists the exceptions and swaps the latter's forward for one
whose residual reads the inner rows), and every
module in it acts on each row alone in its current mode (linear layers,
activations, dropout, ``LayerNorm``/PyG ``LayerNorm(mode="node")``, ``BatchNorm`` in evaluation mode with running
statistics, ``MLP``/``Sequential`` of those: see :func:`rectangular_output`). *Square* (``n_local`` rows, the halo rows
exactly as the edge-list path computes them: aggregating nothing) otherwise: a user's block may mix the conv's
output with its input (``x + conv(x, edge_index)``) or normalise over all the rows it holds (``BatchNorm`` in
training, whose statistics in the edge-list path include the halo rows), and we cannot read its code. So every block
computes on the sparse path what it computes on the edge-list path for its inner rows (``BatchNorm`` statistics
included), and the caller keeps rows ``[:n_inner]`` either way. A rectangular output skips, for the halo rows, the
dense work after the aggregation (``SAGEConv``'s and ``GraphConv``'s linear layers, ``GINConv``'s MLP, the
norm/activation/dropout of the layer) and, for ``GCNConv``, its linear layer when aggregating first is cheaper.

Two caveats of a rectangular output. ``nn.Dropout`` after the conv draws its mask for ``n_inner`` rows instead of
``n_local``, so the inner rows get other (equally distributed) random masks than on the edge-list path.
:class:`~lightning_gnnpipe.nn.NodeDropout` keys its masks by the ids declared with
:func:`~lightning_gnnpipe.nn.node_rows`, one per row of the tensor it gets: in a rectangular block every such tensor
holds the first ``n_inner`` local rows, whose global ids are the chunk's inner nodes, so declare
``rows[:call.out_rows]`` (``call`` is what :func:`sparse_aggregation` yields); declaring all ``n_local`` ids makes
``NodeDropout`` raise its row-count ``ValueError`` rather than mis-key a mask::

    with sparse_aggregation(block, edge_index, adjacency, norm_adjacency) as call, \\
            node_rows(rows[:call.out_rows], epoch):
        out = block(x_local, edge_index)[:n_inner]

**Fallback.** A call that is not the chunk's plain call runs the conv's own (edge-list) forward instead, its output
cut to the output rows: an ``edge_index`` other than the chunk's (the block built new edges: self loops, edge
dropout, ...), ``x`` not of ``n_local`` rows or given as a pair, a ``size`` argument, or an ``edge_weight`` that
requires grad (the adjacency values are not differentiated). Normalised GCN convs never fall back.

Not on the sparse path (:func:`sparse_capable` is ``False``): ``GATConv``, ``GATv2Conv``, ``PNAConv``, ``GINEConv``,
``EdgeConv``, any other or subclassed conv; ``aggr="max"``/``"min"``/aggregation modules (``torch.sparse.mm``'s
``amax`` has no CUDA kernel, and with tied maxima its gradient differs from the edge-list scatter-max: it routes the
gradient to one source where the edge list splits it); ``flow="target_to_source"``; a conv in explain mode. PyG
message-passing hooks (``register_propagate_forward_pre_hook`` ...) are not run on the sparse path (module forward
hooks are).

Measured on CPU (torch 2.13, 2 threads, a shared 2-core machine): chunk 0 of a K=8 METIS plan of a 200k-node graph
with in-degree 20 (25,000 inner nodes, 57,355 halo, 500,282 local edges), one ``(64 -> 64)`` layer forward and
backward, median of 5 (two runs):

================  ===========  ===============  ===============  =====================
layer             edge list    sparse, square   sparse, rect.    ``torch.sparse.mm``
================  ===========  ===============  ===============  =====================
``GCNConv``       0.54-0.56 s  0.058-0.065 s    0.041-0.045 s    0.10-0.11 s (rect.)
``SAGEConv``      0.36-0.60 s  0.12-0.13 s      0.054-0.062 s    0.08-0.10 s (rect.)
================  ===========  ===============  ===============  =====================

Tensors saved for backward: 283 / 308 MB (GCN / SAGE) on the edge list, 20 / 40 MB square, 12 / 18 MB rectangular;
peak RSS growth 318 / 252-272 MB against 104 / 121-139 MB and 74 / 107 MB. The last column is autograd of
``torch.sparse.mm`` on the same CSR (PyG's own path when a conv gets a ``torch.sparse_csr`` ``adj_t``), which
transposes ``adj_t`` in every backward pass. Building a chunk's structure (:func:`build_adjacency`) took 0.033 s and
one operator 0.004 s (16 MB of int64 indices, 8 MB with int32; ``int32`` was not faster: 0.045 vs 0.045 s GCN,
0.065 vs 0.054 s SAGE).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, List, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GCN2Conv, GCNConv, GINConv, GraphConv, MessagePassing, SAGEConv

from lightning_gnnpipe.data.adjacency import ChunkAdjacency, SparseAdjacency
from lightning_gnnpipe.nn.gcn_norm import gcn2_mix, norm_key
from lightning_gnnpipe.nn.forward_swap import current_forward, swapped_forward
from lightning_gnnpipe.nn.inner_rows import conv_input, inner_row_forwards, known_row_wise
from lightning_gnnpipe.nn.positional_rows import PositionalRows, reads_block_input

__all__ = ["SPARSE_CONVS", "SparseCall", "conv_sparse_capable", "rectangular_output", "sparse_aggregation",
           "sparse_capable"]

SPARSE_CONVS = (GCNConv, SAGEConv, GINConv, GraphConv, GCN2Conv)
"""Convs with a sparse forward here (exact types: subclasses may change ``message`` and are refused)."""

_AGGRS = ("add", "sum", "mean")

def conv_sparse_capable(conv: nn.Module) -> bool:
    """Return whether a conv has a sparse forward here and is configured for it.

    True for exact ``GCNConv``, ``SAGEConv``, ``GINConv``, ``GraphConv``, ``GCN2Conv`` with ``aggr`` one of
    ``"add"``, ``"sum"``, ``"mean"``, ``flow="source_to_target"``, ``node_dim`` 0 or -2, not in explain mode and
    holding no other ``MessagePassing`` module.
    """
    if type(conv) not in SPARSE_CONVS:
        return False
    if not isinstance(conv.aggr, str) or conv.aggr not in _AGGRS:
        return False
    if conv.flow != "source_to_target" or conv.node_dim not in (0, -2) or getattr(conv, "explain", False):
        return False
    return not any(isinstance(m, MessagePassing) for m in conv.modules() if m is not conv)


def sparse_capable(block: nn.Module) -> bool:
    """Return whether :func:`sparse_aggregation` can run ``block``: it holds at least one ``MessagePassing`` module
    and every one of them passes :func:`conv_sparse_capable`. Conservative: any other conv gives ``False``."""
    convs = [m for m in block.modules() if isinstance(m, MessagePassing)]
    return bool(convs) and all(conv_sparse_capable(m) for m in convs)


def needs_raw_adjacency(block: nn.Module) -> bool:
    """Whether some conv of the block aggregates over the raw edges (all but ``GCNConv``/``GCN2Conv(normalize=True)``,
    which read the full-graph normalised adjacency)."""
    return any(isinstance(m, MessagePassing) and not (isinstance(m, (GCNConv, GCN2Conv)) and m.normalize)
               for m in block.modules())


def rectangular_output(block: nn.Module) -> bool:
    """Return whether :func:`sparse_aggregation` computes only the inner rows of ``block`` (``n_inner`` rows out).

    True iff ``block`` is :func:`sparse_capable` and :func:`~lightning_gnnpipe.nn.inner_rows.known_row_wise`: a
    ``BasicGNNLayer``, a ``GCNIILayer`` or a PyG ``DeepGCNLayer`` (with the exceptions listed there) whose every module
    acts on each row alone in its current mode (``BatchNorm`` only in evaluation mode with running statistics; PyG
    ``LayerNorm`` only with ``mode="node"``). The answer can change with ``block.train()``/``eval()``.
    """
    return sparse_capable(block) and known_row_wise(block, SPARSE_CONVS)


@dataclass(frozen=True)
class SparseCall:
    """What one :func:`sparse_aggregation` call does.

    Attributes:
        out_rows: Rows every conv of the block returns: ``n_inner`` (rectangular) or ``n_local`` (square).
        rectangular: ``out_rows == n_inner`` because the block is rectangular (:func:`rectangular_output`).
    """

    out_rows: int
    rectangular: bool


def _aggregation_dtype(x: Tensor) -> torch.dtype:
    """float32 for bfloat16/float16 features: torch 2.13 has no reduced-precision CPU CSR matmul, and the edge-list
    path aggregates in float32 too under autocast (its float32 edge weights promote the messages)."""
    return torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype


class _Chunk:
    """The chunk a block call runs on, and the sparse pieces of each conv forward."""

    def __init__(self, edge_index: Tensor, adjacency: Optional[ChunkAdjacency],
                 norm_adjacency: Mapping[Tuple[bool, bool], ChunkAdjacency], out_rows: int,
                 positional: Optional[PositionalRows] = None) -> None:
        self.edge_index, self.adjacency, self.norm_adjacency = edge_index, adjacency, norm_adjacency
        self.positional = positional
        shape = adjacency if adjacency is not None else next(iter(norm_adjacency.values()))
        self.n_inner, self.n_local, self.out_rows = shape.n_inner, shape.n_local, out_rows

    def own_edges(self, edge_index) -> bool:
        ei = self.edge_index
        return edge_index is ei or (isinstance(edge_index, Tensor) and edge_index.layout == torch.strided
                                    and edge_index.shape == ei.shape and edge_index.dtype == ei.dtype
                                    and edge_index.device == ei.device and edge_index.stride() == ei.stride()
                                    and edge_index.data_ptr() == ei.data_ptr())

    def local_rows(self, x) -> bool:
        if self.positional is not None:  # the block's input stands for its local rows; nothing else may reach a conv
            if not self.positional.holds(x):
                raise RuntimeError("sparse_aggregation: with positional rows every conv must get the block's input "
                                   "rows unchanged (reads_block_input), got another tensor.")
            return True
        return isinstance(x, Tensor) and x.dim() == 2 and x.size(0) == self.n_local

    def gathered(self, x):
        """``x`` as local rows ``(n_local, d)``: gathered when it is the positional rows' inner slice."""
        return self.positional.local() if self.positional is not None and self.positional.holds(x) else x

    def raw(self, conv: MessagePassing, x: Tensor, edge_weight: Optional[Tensor] = None) -> SparseAdjacency:
        if self.adjacency is None:
            raise RuntimeError(f"sparse_aggregation: {type(conv).__name__} needs the chunk's raw adjacency, which was "
                               "not built (only normalised ones). Build the chunk graph with raw_adjacency=True.")
        return self.adjacency.operator(_aggregation_dtype(x), conv.aggr == "mean", edge_weight)

    def norm(self, conv: MessagePassing, x: Tensor) -> SparseAdjacency:
        if not self.local_rows(x):
            raise ValueError(f"sparse_aggregation: {type(conv).__name__}(normalize=True) expects the block's local "
                             f"rows, shape ({self.n_local}, d) (got {tuple(x.shape)}).")
        return self.norm_adjacency[norm_key(conv)].operator(_aggregation_dtype(x), conv.aggr == "mean")

    def aggregate(self, op: SparseAdjacency, x: Tensor) -> Tensor:
        """``adj_t @ x`` ``(n_local, d) -> (out_rows, d)``: zero rows (no in-edges) for the halo when square."""
        if x.device != op.adj_t.device:
            raise ValueError(f"sparse_aggregation: features on {x.device}, adjacency on {op.adj_t.device}. "
                             "Move the ChunkAdjacency (ChunkAdjacency.to).")
        p = self.positional
        out = p.matmul(op) if p is not None and p.holds(x) else op.matmul(x.to(op.dtype))
        return F.pad(out, (0, 0, 0, self.out_rows - self.n_inner)) if self.out_rows > self.n_inner else out

    def fallback(self, orig: Callable, *args, **kwargs) -> Tensor:
        return orig(*[self.gathered(a) for a in args], **kwargs)[: self.out_rows]


def _plain(c: _Chunk, x, edge_index, size=None, edge_weight: Optional[Tensor] = None) -> bool:
    """Whether a non-normalising conv's call is the chunk's plain call (else: edge-list fallback)."""
    return (c.local_rows(x) and size is None and c.own_edges(edge_index)
            and (edge_weight is None or not edge_weight.requires_grad))


def _gcn_forward(conv: GCNConv, c: _Chunk, orig: Callable) -> Callable:
    def forward(x, edge_index, edge_weight=None):
        if isinstance(x, (tuple, list)):
            return orig(x, edge_index, edge_weight)  # PyG's own error
        if conv.normalize:
            op = c.norm(conv, x)
        elif _plain(c, x, edge_index, edge_weight=edge_weight):
            op = c.raw(conv, x, edge_weight)
        else:
            return c.fallback(orig, x, edge_index, edge_weight)
        d_in, d_out = x.size(-1), conv.out_channels
        lin_first = c.n_local * d_in * d_out + op.adj_t.values().numel() * d_out
        agg_first = op.adj_t.values().numel() * d_in + c.out_rows * d_in * d_out
        # Under autocast the order decides what is rounded to bfloat16: keep the edge-list path's (linear first).
        if agg_first < lin_first and not isinstance(conv.lin.weight, nn.parameter.UninitializedParameter) \
                and not torch.is_autocast_enabled(x.device.type):
            out = conv.lin(c.aggregate(op, x))  # (A x) W = A (x W): lin has no bias
        else:
            out = c.aggregate(op, conv.lin(c.gathered(x)))
        return out if conv.bias is None else out + conv.bias
    return forward


def _gcn2_forward(conv: GCN2Conv, c: _Chunk, orig: Callable) -> Callable:
    def forward(x, x_0, edge_index, edge_weight=None):
        if conv.normalize:
            op = c.norm(conv, x)
        elif _plain(c, x, edge_index, edge_weight=edge_weight):
            op = c.raw(conv, x, edge_weight)
        else:
            return c.fallback(orig, x, x_0, edge_index, edge_weight)
        return gcn2_mix(conv, c.aggregate(op, x), x_0)
    return forward


def _sage_forward(conv: SAGEConv, c: _Chunk, orig: Callable) -> Callable:
    def forward(x, edge_index, size=None):
        if not _plain(c, x, edge_index, size):
            return c.fallback(orig, x, edge_index, size)
        x_src = conv.lin(c.gathered(x)).relu() if conv.project and hasattr(conv, "lin") else x
        out = conv.lin_l(c.aggregate(c.raw(conv, x_src), x_src))
        if conv.root_weight:
            out = out + conv.lin_r(x[: c.out_rows])
        return F.normalize(out, p=2.0, dim=-1) if conv.normalize else out
    return forward


def _gin_forward(conv: GINConv, c: _Chunk, orig: Callable) -> Callable:
    def forward(x, edge_index, size=None):
        if not _plain(c, x, edge_index, size):
            return c.fallback(orig, x, edge_index, size)
        out = c.aggregate(c.raw(conv, x), x) + (1 + conv.eps) * x[: c.out_rows]
        return conv.nn(out)
    return forward


def _graph_forward(conv: GraphConv, c: _Chunk, orig: Callable) -> Callable:
    def forward(x, edge_index, edge_weight=None, size=None):
        if not _plain(c, x, edge_index, size, edge_weight):
            return c.fallback(orig, x, edge_index, edge_weight, size)
        out = conv.lin_rel(c.aggregate(c.raw(conv, x, edge_weight), x))
        return out + conv.lin_root(x[: c.out_rows])
    return forward


_FORWARDS = {GCNConv: _gcn_forward, GCN2Conv: _gcn2_forward, SAGEConv: _sage_forward, GINConv: _gin_forward,
             GraphConv: _graph_forward}


@contextmanager
def sparse_aggregation(
    block: nn.Module,
    edge_index: Tensor,
    adjacency: Optional[ChunkAdjacency],
    norm_adjacency: Optional[Mapping[Tuple[bool, bool], ChunkAdjacency]] = None,
    allow_rectangular: bool = True,
    positional: Optional[PositionalRows] = None,
) -> Iterator[SparseCall]:
    """Make the block's convs aggregate through the chunk's sparse adjacency while the context is open.

    Use it instead of :func:`~lightning_gnnpipe.nn.gcn_norm.precomputed_norm` for a block call (not nested in
    it). Every conv of the block has its ``forward`` swapped for the duration of the context and restored after
    (an instance-level ``forward`` set before, e.g. by another wrapper, is restored as it was); parameters, buffers
    and flags are untouched. See the module docstring for what each conv computes and which rows it returns.

    Args:
        block: The layer block, :func:`sparse_capable`.
        edge_index: The chunk's local edges ``(2, E_c)`` that the block is called with (targets ``< n_inner``);
            a conv called with another tensor falls back to its edge-list forward.
        adjacency: :func:`~lightning_gnnpipe.data.adjacency.build_adjacency` of ``edge_index``, with
            ``n_inner``/``n_local`` of the chunk, on the features' device; ``None`` when every conv of the block is a
            normalising GCN conv (:func:`needs_raw_adjacency` is ``False``), which reads ``norm_adjacency`` only.
        norm_adjacency: Per ``(improved, add_self_loops)`` of the block's normalising GCN convs, the adjacency of
            the chunk's full-graph ``gcn_norm`` edges, weights = coefficients
            (``build_adjacency(norm_ei, n_inner, n_local, norm_ew)``).
        allow_rectangular: ``False`` forces square outputs (``n_local`` rows) even for a rectangular block.
        positional: The chunk's local rows as positions in a layer's rows
            (:class:`~lightning_gnnpipe.nn.positional_rows.PositionalRows`, no gradient): the block is then called
            with ``positional.inner`` ``(n_inner, d)`` in place of its local rows, and its convs aggregate from
            ``positional.rows``. Only for a rectangular block whose convs read its input unchanged
            (:func:`~lightning_gnnpipe.nn.positional_rows.reads_block_input`), or a rectangular ``"res+"``
            ``DeepGCNLayer`` with ``positional.residual`` set (its rows are then the conv's input,
            :func:`~lightning_gnnpipe.nn.inner_rows.conv_input`, and the block runs its conv alone).

    Yields:
        :class:`SparseCall`: ``out_rows`` (``n_inner`` or ``n_local``), the rows each conv returns; declare
        ``node_rows(rows[:out_rows], epoch)`` for :class:`~lightning_gnnpipe.nn.NodeDropout`.

    Shapes:
        Inside the context, ``block(x_local, edge_index)`` with ``x_local`` ``(n_local, d)`` returns
        ``(out_rows, d')``, its first ``n_inner`` rows (and their gradients) equal to the edge-list path's.

    Raises:
        ValueError: ``block`` is not :func:`sparse_capable`; ``adjacency`` does not match ``edge_index``
            (edge count); a normalising conv's ``(improved, add_self_loops)`` is missing from ``norm_adjacency``
            or its adjacency's shape differs. Inside the context: a normalising conv called on rows other than
            ``(n_local, d)``, or features and adjacency on different devices.
    """
    if not sparse_capable(block):
        names = sorted({type(m).__name__ for m in block.modules() if isinstance(m, MessagePassing)
                        and not conv_sparse_capable(m)})
        raise ValueError(f"sparse_aggregation: {type(block).__name__} is not sparse-capable (convs without a "
                         f"sparse forward or configured off it: {names or 'no MessagePassing module'}). "
                         "Check sparse_capable(block) and use the edge-list path.")
    if adjacency is None and needs_raw_adjacency(block):
        raise ValueError(f"sparse_aggregation: {type(block).__name__} has convs that aggregate over the raw edges "
                         "(got adjacency=None). Pass the chunk's raw adjacency.")
    raw = adjacency
    if adjacency is None:
        if not norm_adjacency:
            raise ValueError("sparse_aggregation: neither a raw nor a normalised adjacency was given.")
        adjacency = next(iter(norm_adjacency.values()))  # only its shape is read below
    elif edge_index.dim() != 2 or edge_index.size(1) != adjacency.num_edges:
        raise ValueError(f"sparse_aggregation: `adjacency` holds {adjacency.num_edges} edges, `edge_index` has "
                         f"shape {tuple(edge_index.shape)}. Build the adjacency from this edge_index.")
    norm_adjacency = dict(norm_adjacency or {})
    convs: List[MessagePassing] = [m for m in block.modules() if isinstance(m, MessagePassing)]
    for conv in convs:
        if isinstance(conv, (GCNConv, GCN2Conv)) and conv.normalize:
            key = norm_key(conv)
            if key not in norm_adjacency:
                raise ValueError(f"sparse_aggregation: {type(conv).__name__}(normalize=True) needs the full-graph "
                                 f"normalised adjacency for (improved, add_self_loops)={key} (got keys "
                                 f"{sorted(norm_adjacency)}).")
            a = norm_adjacency[key]
            if (a.n_inner, a.n_local) != (adjacency.n_inner, adjacency.n_local):
                raise ValueError(f"sparse_aggregation: normalised adjacency {key} is ({a.n_inner}, {a.n_local}), "
                                 f"the chunk's ({adjacency.n_inner}, {adjacency.n_local}).")
    rect = allow_rectangular and rectangular_output(block)
    residual = None if positional is None else positional.residual
    if positional is not None and not (rect and (conv_input(block) is not None if residual is not None
                                                 else reads_block_input(block))):
        raise ValueError(f"sparse_aggregation: positional rows need a rectangular block whose convs read its input "
                         f"unchanged (reads_block_input), or a 'res+' DeepGCNLayer given its conv's input and the "
                         f"residual (conv_input); {type(block).__name__} is neither (rectangular: {rect}, "
                         f"residual given: {residual is not None}).")
    out_rows = adjacency.n_inner if rect else adjacency.n_local
    chunk = _Chunk(edge_index, raw, norm_adjacency, out_rows, positional)
    swaps = [(conv, _FORWARDS[type(conv)](conv, chunk, current_forward(conv))) for conv in convs]
    with swapped_forward(swaps + (inner_row_forwards(block, residual) if rect else [])):
        yield SparseCall(out_rows=out_rows, rectangular=rect)
