"""Call one layer block on one chunk: through its CSR adjacency where it can, else on its edge list.

Every place that runs a block on a chunk's local rows ``[inner; halo]`` (a pipeline stage's micro-batch and its
exact full-graph forward, one partition of graph parallelism, the balance profiler) calls a :class:`ChunkCaller`, so
each block gets the same kernels everywhere:

* a block whose convs all aggregate by a sparse-dense matmul (:func:`~lightning_gnnpipe.nn.sparse.sparse_capable`:
  ``GCNConv``, ``SAGEConv``, ``GINConv``, ``GraphConv``, ``GCN2Conv``) runs through the chunk's adjacency
  (:func:`~lightning_gnnpipe.nn.sparse.sparse_aggregation`; a PyG ``BasicGNN`` layer then computes only the inner
  rows);
* any other block (GAT, PNA, ...), and every block under autocast (``precision="bf16-mixed"``), passes messages
  along the chunk's edge list, with the full-graph GCN
  normalisation fed in (:func:`~lightning_gnnpipe.nn.gcn_norm.precomputed_norm`).

Both declare the global node id of each row (:func:`~lightning_gnnpipe.nn.node_rows`), so that
:class:`~lightning_gnnpipe.nn.NodeDropout` drops a row as its owner chunk does.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import MessagePassing

from lightning_gnnpipe.data.chunk_graph import ChunkGraph
from lightning_gnnpipe.nn.dropout import node_rows
from lightning_gnnpipe._compat import has_forward_pre_hooks
from lightning_gnnpipe.nn.gcn_norm import normalized_convs, precomputed_norm
from lightning_gnnpipe.nn.inner_rows import conv_input
from lightning_gnnpipe.nn.positional_rows import PositionalRows, reads_block_input
from lightning_gnnpipe.nn.sparse import needs_raw_adjacency, rectangular_output, sparse_aggregation, sparse_capable
from lightning_gnnpipe.nn.stack import BasicGNNLayer, call_block, uses_graph


class ChunkCaller:
    """What a :class:`ChunkCaller` needs to know of a block, computed once: its GCN convs and its kernel.

    Args:
        block: The layer block.
        graph: The chunk graphs it runs on (``graph.adjacency`` set: built with ``sparse=True``).
    """

    def __init__(self, block: nn.Module, graph: ChunkGraph) -> None:
        self.block, self.graph = block, graph
        self.norm_convs: List[nn.Module] = normalized_convs(block)
        self.sparse = graph.adjacency is not None and sparse_capable(block)

    def reads_in_place(self, device: torch.device) -> bool:
        """Whether a call without gradient may read the local rows in place (``positional``, :meth:`__call__`): the
        block runs on the sparse path, rectangular, its convs reading its input unchanged, outside autocast."""
        return self.sparse and not torch.is_autocast_enabled(device.type) and rectangular_output(self.block) \
            and reads_block_input(self.block)

    def conv_input(self, device: torch.device) -> Optional[Callable[[Tensor], Tensor]]:
        """For a ``"res+"`` ``DeepGCNLayer`` that could run on rows in place but for what it computes before its
        conv: that row-wise function (:func:`~lightning_gnnpipe.nn.inner_rows.conv_input`), else ``None``. An exact
        forward applies it to every row once and calls the block with positional rows of its output and the
        residual (:class:`~lightning_gnnpipe.nn.positional_rows.PositionalRows`)."""
        if not (self.sparse and not torch.is_autocast_enabled(device.type) and rectangular_output(self.block)
                and not has_forward_pre_hooks(self.block)):
            return None
        return conv_input(self.block)

    def __call__(self, x_local: Tensor, c: int, rows: Tensor, epoch: int, h0: Optional[Tensor] = None,
                 positional: Optional[PositionalRows] = None) -> Tensor:
        """Run the block on chunk ``c``'s local rows.

        Args:
            x_local: ``(n_c + h_c, d)``: inner rows, then halo rows; with ``positional``, its ``inner`` rows
                ``(n_c, d)`` instead.
            c: The chunk.
            rows: Global node id of each local row ``(n_c + h_c,)``.
            epoch: Keys NodeDropout's masks.
            h0: The initial embedding of the inner rows ``(n_c, d_0)`` (or of the local rows), for blocks that take
                ``x0`` (GCNII); zero-padded here to the rows the block computes.
            positional: The local rows as positions in a layer's rows (no gradient; only where
                :meth:`reads_in_place`), :func:`~lightning_gnnpipe.nn.sparse.sparse_aggregation`.

        Returns:
            At least ``n_c`` rows, the first ``n_c`` the inner nodes' outputs (the caller keeps those).
        """
        g, ei = self.graph, self.graph.edge_index[c]
        # Under autocast (bf16-mixed) the edge list keeps the single-device rounding exactly: a sparse sum in another
        # order moves float32 results by ~1e-7, which the next bfloat16 matmul can turn into a different rounding.
        if self.sparse and not torch.is_autocast_enabled(x_local.device.type):
            assert g.adjacency is not None and g.norm_adjacency is not None
            with sparse_aggregation(self.block, ei, g.adjacency[c], g.norm_adjacency[c],
                                    positional=positional) as call, \
                    node_rows(rows[:call.out_rows], epoch):
                return call_block(self.block, x_local, ei, _padded(h0, call.out_rows))
        if positional is not None:
            raise ValueError(f"ChunkCaller: {type(self.block).__name__} does not run on the sparse path here; "
                             "positional rows need it (reads_in_place).")
        if g.compacted:  # its edge lists were dropped: the edge-list path would aggregate over nothing
            raise RuntimeError(
                f"GNNPipe: block {type(self.block).__name__} takes the edge-list path (autocast on: "
                f"{torch.is_autocast_enabled(x_local.device.type)}), but its chunk graph was built compact, for the "
                "sparse path only. Build it with chunk_graph_options(blocks, autocast=True) under autocast.")
        with precomputed_norm(self.norm_convs, g.norm_edges[c]), node_rows(rows, epoch):
            return call_block(self.block, x_local, ei, _padded(h0, x_local.size(0)))


def _padded(h0: Optional[Tensor], rows: int) -> Optional[Tensor]:
    """``x0`` of the inner rows ``(n_c, d_0)``, zero-padded to the ``rows`` the block computes (a GCNII layer mixes
    ``x0`` row by row, so the halo rows' zeros never reach an inner output)."""
    if h0 is None or h0.size(0) >= rows:
        return h0
    return F.pad(h0, (0, 0, 0, rows - h0.size(0)))


def chunk_graph_options(blocks: List[nn.Module], autocast: bool = False) -> Dict[str, bool]:
    """What :func:`~lightning_gnnpipe.data.chunk_graph.build_chunk_graph` must build for these blocks.

    Args:
        blocks: The blocks that will run on the chunk graphs.
        autocast: Whether they run under autocast (``bf16-mixed``): then every block uses its edge list.

    Returns:
        ``sparse`` (some block runs on the sparse path), ``raw_adjacency`` (some sparse block aggregates over the
        raw edges), ``norm_edge_lists`` (some block on the edge-list path may normalise) and ``compact`` (every
        block is a PyG layer of known code, :class:`~lightning_gnnpipe.nn.stack.BasicGNNLayer`, whose normalising
        GCN conv sums: no raw edge list and no other aggregation values are needed).
    """
    sparse = [] if autocast else [b for b in blocks if sparse_capable(b)]
    edge_list = [b for b in blocks if uses_graph(b) and not any(b is s for s in sparse)]
    convs = [m for b in sparse for m in b.modules() if isinstance(m, MessagePassing)]
    return {
        "sparse": bool(sparse),
        "raw_adjacency": any(needs_raw_adjacency(b) for b in sparse),
        "norm_edge_lists": bool(edge_list),
        "compact": bool(sparse) and not edge_list and all(isinstance(b, BasicGNNLayer) for b in sparse)
        and all(c.aggr in ("add", "sum") for c in convs),
    }
