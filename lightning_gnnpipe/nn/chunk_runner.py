"""Run consecutive layer blocks on one chunk: the one per-chunk loop of a pipeline stage and of a graph partition.

A chunk ``c`` holds ``n_c`` inner rows (a pipeline micro-batch, or under graph parallelism a rank's whole partition)
and reads ``h_c`` halo rows. :meth:`ChunkRunner.run` takes the inner rows through every block in turn:

* a node-wise block (no message passing) runs on the inner rows alone;
* a message-passing block runs on the local rows ``[inner; halo]`` (``n_c + h_c``) through the chunk's kernels
  (:class:`~lightning_gnnpipe.nn.chunk_call.ChunkCaller`), and the inner rows of its output are kept. Layer 0's halo
  rows are the node features; a later layer's come from the caller (:data:`HaloFill`): a stage's history tables
  (GNNPipe, arXiv 2308.10087, Sec. 4), the rows the other partitions send (graph parallelism), or both (hybrid).

When the model carries the initial embedding ``x0`` (GCNII, arXiv 2007.02133: block 0's output), every block that
takes it gets the inner rows' ``x0``, padded with zeros for the halo rows (a GCNII layer mixes ``x0`` row by row, so
those rows never reach an inner output). :meth:`ChunkRunner.run_full` is the exact whole-graph forward of the same
blocks, layer by layer, every chunk reading exact halo rows.

Every block call declares the global node id of each row and the epoch (:func:`~lightning_gnnpipe.nn.node_rows`), so
that :class:`~lightning_gnnpipe.nn.NodeDropout` drops a halo row exactly as its owner chunk does.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from lightning_gnnpipe.data.chunk_graph import ChunkGraph
from lightning_gnnpipe.data.node_rows import NodeRows, select_rows_into
from lightning_gnnpipe.nn.chunk_call import ChunkCaller
from lightning_gnnpipe.nn.dropout import node_rows
from lightning_gnnpipe.nn.positional_rows import PositionalRows
from lightning_gnnpipe.nn.stack import call_block, uses_graph

HaloGrad = Callable[[Tensor], None]
"""``on_halo_grad(grad)``: takes the gradient ``(h_c, d)`` that reaches a chunk's halo rows in the backward pass."""

HaloFill = Callable[[int, Tensor, int, Tensor], Tuple[Tensor, Optional[HaloGrad]]]
"""``fill(layer, h, c, out) -> (h, on_halo_grad)``: write chunk ``c``'s halo rows of ``layer`` (``>= 1``) into ``out``
``(h_c, d)`` (differentiably where their gradient flows on by autograd, e.g. rows received live) and return the inner
rows ``h`` ``(n_c, d)`` the block should get and, or ``None``, what takes the halo rows' gradient otherwise
(:data:`HaloGrad`; ``out`` then carries none)."""


class _InnerRowsInto(torch.autograd.Function):
    """``local[:n] = h`` in place, for local rows ``local`` ``(n + h_c, d)`` whose halo rows carry no gradient: the
    backward hands ``grad[:n]`` to ``h`` (a view, where autograd's copy into a slice clones the whole gradient) and
    ``grad[n:]`` to ``on_halo_grad`` when one is given."""

    @staticmethod
    def forward(ctx, h: Tensor, local: Tensor, on_halo_grad: Optional[HaloGrad]) -> Tensor:  # type: ignore[override]
        ctx.n, ctx.on_halo_grad = h.size(0), on_halo_grad
        local[: ctx.n].copy_(h)
        ctx.mark_dirty(local)
        return local

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        if ctx.on_halo_grad is not None:
            ctx.on_halo_grad(grad[ctx.n:])
        return grad[: ctx.n], None, None


def _with_inner_rows(h: Tensor, local: Tensor, on_halo_grad: Optional[HaloGrad]) -> Tensor:
    """``local`` ``(n + h_c, d)`` with ``h`` ``(n, d)`` as its first rows; the halo rows' gradient goes to
    ``on_halo_grad`` (only where ``local``'s halo rows carry none themselves)."""
    if local.requires_grad:  # rows received live: autograd takes their gradient back
        if on_halo_grad is not None:
            raise RuntimeError("ChunkRunner: a halo fill returned `on_halo_grad` but wrote differentiable halo rows "
                               "(got both); the gradient would reach the rows twice.")
        local[: h.size(0)] = h
        return local
    if torch.is_grad_enabled() and (h.requires_grad or on_halo_grad is not None):
        return _InnerRowsInto.apply(h, local, on_halo_grad)
    local[: h.size(0)] = h
    return local

Combine = Callable[[Tensor], Tensor]
"""``combine(out) -> out``: what :meth:`ChunkRunner.run_full` does with a layer's ``(|V|, d)`` output, whose rows are
those of the chunks this runner runs (zeros elsewhere), before the next layer (e.g. the other partitions' rows of
this partition's halo, received)."""

BeforeLayer = Callable[[int, Tensor, Optional[Tensor]], None]
"""``before_layer(layer, h, position)``: sees each layer's input rows ``h`` before :meth:`ChunkRunner.run_full` runs the
layer; ``position`` ``(|V|,)`` is each node's row in ``h`` where the rows are not in node order, else ``None``."""


class ChunkRunner:
    """The blocks of one stage (or of the whole model) and how they run on one chunk.

    Args:
        blocks: The layer blocks, in order (the user's modules, shared, not copied).
        layer_ids: Global index of each block in the model, consecutive.
        graph: Chunk-local graph structure.
        x: Node features ``(|V|, F)``; needed when ``layer_ids`` holds layer 0 (its halo rows), else ``None``.
        chunks: The chunks this runner runs (default: all of ``graph``'s).
        carry_x0: Whether some block of the model takes ``x0``; then block 0's output is ``x0``.
        activation_checkpointing: Recompute each message-passing block in the backward pass
            (``torch.utils.checkpoint``): between forward and backward only the block's local input is kept.

    Raises:
        ValueError: ``layer_ids`` holds layer 0 but ``x`` is ``None``.

    Shapes:
        :meth:`run`: ``h`` ``(n_c, d_in)``, ``h0`` ``(n_c, d_0)`` or ``None`` -> ``(n_c, d_out)`` and ``h0``.
    """

    def __init__(self, blocks: Sequence[nn.Module], layer_ids: Sequence[int], graph: ChunkGraph,
                 x: Optional[Tensor] = None, chunks: Optional[Sequence[int]] = None, carry_x0: bool = False,
                 activation_checkpointing: bool = False) -> None:
        if 0 in layer_ids and x is None:
            raise ValueError("ChunkRunner: the blocks hold layer 0, which reads the node features `x` (got None).")
        self.blocks, self.layer_ids, self.graph, self.x = list(blocks), list(layer_ids), graph, x
        self.carry_x0, self.activation_checkpointing = carry_x0, activation_checkpointing
        self.chunks = list(range(graph.num_chunks)) if chunks is None else list(chunks)
        self.uses_graph = [uses_graph(b) for b in self.blocks]
        self.callers = [ChunkCaller(b, graph) for b in self.blocks]  # sparse adjacency or edge list, per block
        mine = set(self.chunks)
        self.local_ids = [torch.cat([n, h]) if c in mine else n[:0]  # global id of each local row of chunk c
                          for c, (n, h) in enumerate(zip(graph.nodes, graph.halo))]
        self._no_edges = graph.nodes[0].new_zeros(2, 0)  # what a node-wise block gets as `edge_index`
        self._order: Optional[Tuple[Tensor, Tensor, List[Tensor], List[Tuple[int, int]]]] = None

    def call(self, j: int, x_local: Tensor, c: int, epoch: int, h0: Optional[Tensor] = None,
             positional: Optional[PositionalRows] = None) -> Tensor:
        """Run message-passing block ``j`` on chunk ``c``'s local rows ``(n_c + h_c, d)``; at least ``n_c`` rows out.

        ``h0``: the inner rows' ``x0`` ``(n_c, d_0)`` for a block that takes it (the caller pads it with zeros to
        the rows the block computes, :class:`~lightning_gnnpipe.nn.chunk_call.ChunkCaller`). ``positional``: read the
        local rows in place (``x_local`` is then its inner rows; no gradient).
        """
        if self.activation_checkpointing and torch.is_grad_enabled() and x_local.requires_grad:
            # Keep only the block's input until the backward pass, which runs the block again (same dropout draws:
            # the RNG state is saved with it). Halo rows are read and written outside, so the rerun sees the very
            # inputs of the first run.
            return checkpoint(self.callers[j], x_local, c, self.local_ids[c], epoch, h0, use_reentrant=False)
        return self.callers[j](x_local, c, self.local_ids[c], epoch, h0, positional)

    def node_wise(self, j: int, h: Tensor, ids: Tensor, epoch: int, h0: Optional[Tensor] = None) -> Tensor:
        """Run node-wise block ``j`` on rows ``h`` ``(n, d)`` of the nodes ``ids`` ``(n,)``."""
        return self.node_wise_block(self.blocks[j], h, ids, epoch, h0)

    def node_wise_block(self, block: nn.Module, h: Tensor, ids: Tensor, epoch: int,
                        h0: Optional[Tensor] = None) -> Tensor:
        """Run a node-wise ``block`` on rows ``h`` ``(n, d)`` of the nodes ``ids`` ``(n,)``."""
        with node_rows(ids, epoch):
            return call_block(block, h, self._no_edges, h0)

    def run(self, h: Tensor, h0: Optional[Tensor], c: int, epoch: int,
            halo: HaloFill) -> Tuple[Tensor, Optional[Tensor]]:
        """Take chunk ``c``'s inner rows ``h`` through every block; return them and ``x0`` (``h0``).

        Args:
            h: The inner rows entering the first block ``(n_c, d)`` (layer 0: the chunk's features).
            h0: Their ``x0`` ``(n_c, d_0)`` when carried and block 0 is not among the blocks, else ``None``.
            c: The chunk.
            epoch: Keys :class:`~lightning_gnnpipe.nn.NodeDropout`'s masks.
            halo: Fills the halo rows of every message-passing layer ``>= 1`` (:data:`HaloFill`).
        """
        nodes, halo_ids = self.graph.nodes[c], self.graph.halo[c]
        n = nodes.numel()
        for j, layer in enumerate(self.layer_ids):
            if not self.uses_graph[j]:
                h = self.node_wise(j, h, nodes, epoch, h0)
            else:  # one copy of the local rows: the inner rows, then the halo rows written in place
                x_local = h.new_empty(n + halo_ids.numel(), h.size(1))
                on_halo_grad: Optional[HaloGrad] = None
                if layer == 0:
                    _select_into(self.x, halo_ids, x_local[n:])
                else:
                    h, on_halo_grad = halo(layer, h, c, x_local[n:])
                x_local = _with_inner_rows(h, x_local, on_halo_grad)  # the inner rows' gradient flows back to h
                h = self.call(j, x_local, c, epoch, h0)[:n]
            h0 = h if layer == 0 and self.carry_x0 else h0
        return h, h0

    def run_full(self, h: Tensor, h0: Optional[Tensor], epoch: int,
                 before_layer: Optional[BeforeLayer] = None,
                 combine: Optional[Combine] = None, chunk_order: Tuple[bool, bool] = (False, False),
                 ) -> Tuple[Tensor, Optional[Tensor]]:
        """Compute every block exactly for the whole graph, layer by layer; return the output and ``x0``.

        Every chunk's halo rows are the exact rows of the layer's input, so the result is the unsplit blocks'.

        Args:
            h: Input rows of all nodes ``(|V|, d)``.
            h0: ``x0`` of all nodes ``(|V|, d_0)`` when carried and block 0 is not among the blocks.
            epoch: Keys NodeDropout's masks.
            before_layer: Called ``before_layer(layer, h, position)`` with each layer's input rows ``h`` and, where
                they are not in node order, each node's row in them ``(|V|,)`` (else ``None``); e.g. a history
                refresh (:meth:`~lightning_gnnpipe.history.history.History.refresh`).
            combine: Applied to each message-passing layer's output (:data:`Combine`).
            chunk_order: Whether ``h`` and ``h0`` come, and whether the outputs leave, in chunk order (chunk 0's inner
                rows, then chunk 1's, ...: :meth:`chunk_order`) instead of node order; e.g. between the stages of one
                plan, which share that order. Only where this runner holds every chunk.

        Raises:
            ValueError: ``chunk_order`` asked of a runner that holds some chunks only.
        """
        if len(self.chunks) == self.graph.num_chunks:  # the chunks cover every node: run them in chunk order
            return self._run_full_chunk_order(h, h0, epoch, before_layer, chunk_order)
        if any(chunk_order):
            raise ValueError(f"ChunkRunner.run_full: rows in chunk order need a runner of every chunk (this one runs "
                             f"{len(self.chunks)} of {self.graph.num_chunks}); got chunk_order={chunk_order}.")
        g = self.graph
        for j, layer in enumerate(self.layer_ids):
            if before_layer is not None:
                before_layer(layer, h, None)
            if not self.uses_graph[j] and isinstance(h, NodeRows):  # a partition's features: the rows it holds
                o = self.node_wise(j, h.values, h.ids, epoch, None if h0 is None else h0.index_select(0, h.ids))
                h = o.new_zeros(h.size(0), o.size(-1)).index_copy_(0, h.ids.to(o.device), o)
            elif not self.uses_graph[j]:
                h = self.node_wise(j, h, torch.arange(h.size(0), device=h.device), epoch, h0)
            else:
                out: Optional[Tensor] = None
                for c in self.chunks:
                    nodes = g.nodes[c]
                    x_local = h.index_select(0, self.local_ids[c])  # inner rows, then halo rows: one copy
                    o = self.call(j, x_local, c, epoch, None if h0 is None else h0.index_select(0, nodes))
                    if out is None:
                        out = o.new_zeros(h.size(0), o.size(-1))
                    out.index_copy_(0, nodes, o[: nodes.numel()])
                assert out is not None
                h = combine(out) if combine is not None else out
            h0 = h if layer == 0 and self.carry_x0 else h0
        return h, h0

    def _run_full_chunk_order(self, h: Tensor, h0: Optional[Tensor], epoch: int, before_layer: Optional[BeforeLayer],
                              chunk_order: Tuple[bool, bool]) -> Tuple[Tensor, Optional[Tensor]]:
        """:meth:`run_full` when this runner holds every chunk (one partition: nothing to combine).

        The rows are kept in chunk order (chunk 0's inner rows, then chunk 1's, ...), so that each chunk's inner rows
        are one slice: a chunk's output is copied into its slice instead of scattered to its nodes' rows (a scatter
        of ``n_c`` rows costs several times a contiguous copy on a CPU), and its local rows are read from that slice
        and its halo rows: in place, without a gathered copy, where the block allows it and no gradient is recorded
        (:class:`~lightning_gnnpipe.nn.positional_rows.PositionalRows`), else gathered into one tensor. A ``"res+"``
        ``DeepGCNLayer`` normalises and activates its input before its conv: that is done once for every row of the
        layer, and its conv reads those rows in place (:meth:`~lightning_gnnpipe.nn.chunk_call.ChunkCaller.
        conv_input`), where each chunk would do it again for its halo rows (about as many as the inner rows). The rows are
        put in chunk order once on entry and back in node order on exit, unless they come or leave so (``chunk_order``).
        """
        order, position, local, bounds = self._chunk_order()
        renamed: Dict[int, Tuple[Tensor, Tensor]] = {}  # operators with columns renamed to positions, this forward
        positions: Dict[int, Tensor] = {}  # each chunk's local rows' positions, for this forward
        ordered_in, ordered_out = chunk_order
        h_in, h0_in = h, h0
        if not ordered_in:
            h = h.index_select(0, order)
            h0 = None if h0 is None else h0.index_select(0, order)
        for j, layer in enumerate(self.layer_ids):
            if before_layer is not None and j == 0 and not ordered_in:
                before_layer(layer, h_in, None)
            elif before_layer is not None:
                before_layer(layer, h, position)
            if not self.uses_graph[j]:
                h = self.node_wise(j, h, order, epoch, h0)
            else:
                out: Optional[Tensor] = None
                in_place = not torch.is_grad_enabled() and self.callers[j].reads_in_place(h.device)
                before_conv = None if in_place or torch.is_grad_enabled() else self.callers[j].conv_input(h.device)
                conv_rows = h if before_conv is None else before_conv(h)  # "res+": once a row, not once a chunk
                for c, (a, b) in zip(self.chunks, bounds):
                    h0_c = None if h0 is None else h0[a:b]
                    if in_place or before_conv is not None:  # the convs read their rows in place: no gather
                        rows = PositionalRows(conv_rows, a, self._local_positions(c, a, b, positions), b - a,
                                              renamed, None if before_conv is None else h[a:b])
                        o = self.call(j, rows.inner, c, epoch, h0_c, rows)
                    else:
                        halo = local[c]
                        x_local = h.new_empty(b - a + halo.numel(), h.size(1))
                        x_local[: b - a].copy_(h[a:b])
                        _select_into(h, halo, x_local[b - a:])
                        o = self.call(j, x_local, c, epoch, h0_c)
                    if out is None:
                        out = o.new_empty(h.size(0), o.size(-1))
                    out[a:b].copy_(o[: b - a])
                assert out is not None
                h = out
            h0 = h if layer == 0 and self.carry_x0 else h0
        if ordered_out:
            return h, h0
        h = h.index_select(0, position)
        if h0 is not None:  # x0 passed through unchanged goes back as it came, if it came in node order
            passed = h0_in is not None and 0 not in self.layer_ids and not ordered_in
            h0 = h0_in if passed else h0.index_select(0, position)
        return h, h0

    def chunk_order(self) -> Tuple[Tensor, Tensor]:
        """The node ids in chunk order ``(|V|,)`` and each node's position in it ``(|V|,)`` (built once)."""
        order, position, _, _ = self._chunk_order()
        return order, position

    def _local_positions(self, c: int, a: int, b: int, cache: Dict[int, Tensor]) -> Tensor:
        """Chunk ``c``'s local rows' positions in chunk order ``(n_c + h_c,)``: ``a .. b - 1``, then its halo's (kept in
        ``cache``, the forward's)."""
        if c not in cache:
            halo = self._chunk_order()[2][c]
            cache[c] = torch.cat([torch.arange(a, b, device=halo.device, dtype=halo.dtype), halo])
        return cache[c]

    def _chunk_order(self) -> Tuple[Tensor, Tensor, List[Tensor], List[Tuple[int, int]]]:
        """Node ids in chunk order ``(|V|,)``, each node's position in it ``(|V|,)``, per chunk the positions of its
        halo rows ``(h_c,)``, and each chunk's slice ``[a, b)`` (built once)."""
        if self._order is None:
            g = self.graph
            order = torch.cat([g.nodes[c] for c in self.chunks])
            position = torch.empty_like(order)
            position[order] = torch.arange(order.numel(), device=order.device)
            sizes = [g.nodes[c].numel() for c in self.chunks]
            ends = torch.tensor(sizes).cumsum(0).tolist()
            bounds = [(e - s, e) for s, e in zip(sizes, ends)]
            local = [position[g.halo[c]] for c in range(g.num_chunks)]
            self._order = (order, position, local, bounds)
        return self._order

_select_into = select_rows_into  # out[:] = source[index]: a feature matrix or a partition's NodeRows

