"""Per-chunk local graphs a stage needs: raw edges and full-graph-normalised edges.

``GCNConv(normalize=True)`` (and ``GCN2Conv``) computes ``D^-1/2 (A + I) D^-1/2`` from the degrees of the graph it
is given. On a chunk's local graph a halo node has only its chunk-local edges, so its degree is wrong. GNNPipe
needs the full-graph coefficients (arXiv 2308.10087, Sec. 4.1), so they are computed once with
:func:`torch_geometric.nn.conv.gcn_conv.gcn_norm` on the whole graph and sliced per chunk here;
:func:`~lightning_gnnpipe.nn.gcn_norm.precomputed_norm` feeds them to the convs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from torch_geometric.nn.conv.gcn_conv import gcn_norm

from lightning_gnnpipe.data.adjacency import ChunkAdjacency, build_chunk_adjacency
from lightning_gnnpipe.data.chunk import ChunkPlan

NormKey = Tuple[bool, bool]
"""``(improved, add_self_loops)`` of a ``GCNConv``/``GCN2Conv``: which full-graph normalisation it needs."""


def full_graph_norm(edge_index: Tensor, num_nodes: int, key: NormKey, dtype,
                    degrees: Optional[Tuple[Tensor, Tensor]] = None,
                    loop_nodes: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Return ``(edge_index (2, |E'|), edge_weight (|E'|,))`` normalised on the whole graph.

    Without ``degrees``, PyG's ``gcn_norm`` of ``edge_index``, the whole graph's edges. With ``degrees`` (the whole
    graph's in-degrees ``(|V|,)`` without and with self loops, :attr:`ChunkPlan.degrees`), ``edge_index`` may be a
    subset, the edges into one partition: the same weights are computed for those edges from the given degrees, the
    same operations in the same order as ``gcn_norm`` (so bit-equal; ``tests/test_partitioned.py``), and the self
    loops are added for ``loop_nodes`` only (sorted ids; default all ``|V|``), appended after the edges as
    ``gcn_norm`` appends them.
    """
    improved, add_self_loops = key
    if degrees is None:
        return gcn_norm(edge_index, None, num_nodes, improved, add_self_loops, "source_to_target", dtype)
    # gcn_norm without edge weights: add_remaining_self_loops keeps the non-loop edges and appends one loop per node
    # (weight 1 whatever `improved`: the fill value applies to given weights only); the degree is the count of
    # edges into a node, summed in floating point (exact below 2^24)
    without_loops, with_loops = degrees
    if add_self_loops:
        loops = torch.arange(num_nodes) if loop_nodes is None else loop_nodes
        edge_index = torch.cat([edge_index[:, edge_index[0] != edge_index[1]], loops.view(1, -1).repeat(2, 1)], 1)
        count = without_loops + 1
    else:
        count = with_loops
    weight = torch.ones(edge_index.size(1), dtype=dtype)
    deg_inv_sqrt = count.to(weight.dtype).pow_(-0.5)
    deg_inv_sqrt.masked_fill_(deg_inv_sqrt == float("inf"), 0)
    row, col = edge_index[0], edge_index[1]
    return edge_index, deg_inv_sqrt[row] * weight * deg_inv_sqrt[col]


@dataclass
class ChunkGraph:
    """Chunk-local graph structure for every chunk, on one device.

    Attributes:
        nodes: Per chunk, inner node ids ``(n_c,)``.
        halo: Per chunk, halo node ids ``(h_c,)``.
        edge_index: Per chunk, local edges ``(2, E_c)`` into inner nodes (ids: inner first,
            then halo).
        norm_edges: Per chunk, per ``(improved, add_self_loops)``, the local edges and
            full-graph ``gcn_norm`` weights ``((2, E'_c), (E'_c,))``.
        max_chunk_size: ``M``, rows of every padded micro-batch.
        adjacency: Per chunk, the CSR adjacency of ``edge_index[c]`` ``(n_c, n_c + h_c)``
            (:mod:`~lightning_gnnpipe.data.adjacency`), when built with ``sparse=True``; else ``None``. Entries are
            ``None`` for chunks not built (``chunks``) or without raw adjacency.
        norm_adjacency: Per chunk, per key of ``norm_edges``, the adjacency of the normalised edges
            (values: the full-graph coefficients); ``None`` without ``sparse``.
        compacted: Built with ``compact``: no edge lists, only the normalised sum operators.
    """

    nodes: List[Tensor]
    halo: List[Tensor]
    edge_index: List[Tensor]
    norm_edges: List[Dict[NormKey, Tuple[Tensor, Tensor]]]
    max_chunk_size: int
    adjacency: Optional[List[ChunkAdjacency]] = None
    norm_adjacency: Optional[List[Dict[NormKey, ChunkAdjacency]]] = None
    compacted: bool = False

    @property
    def num_chunks(self) -> int:
        return len(self.nodes)

    def nbytes(self) -> int:
        """Bytes of every tensor the chunk graphs hold (ids, edge lists, CSR structures and cached operators), each
        storage counted once."""
        tensors: List[Tensor] = [*self.nodes, *self.halo, *self.edge_index]
        tensors += [t for per in self.norm_edges for pair in per.values() for t in pair]
        adjacencies = [a for a in (self.adjacency or []) if a is not None]
        adjacencies += [a for per in (self.norm_adjacency or []) for a in per.values()]
        for a in adjacencies:
            tensors += [a.crow, a.col, a.perm, a.t_crow, a.t_col, a.t_perm, a.weight]
            tensors += [m.values() for op in a._cache.values() for m in (op.adj_t, op.adj)]
        return storage_bytes(tensors)


def storage_bytes(tensors: Iterable[Optional[Tensor]]) -> int:
    """Bytes of the storages behind ``tensors`` (``None`` skipped), each storage counted once."""
    seen: Dict[int, int] = {}
    for t in tensors:
        if t is not None:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def build_chunk_graph(
    plan: ChunkPlan, edge_index: Tensor, norm_keys: Iterable[NormKey], device: torch.device, dtype=torch.float32,
    sparse: bool = False, raw_adjacency: bool = True, norm_edge_lists: bool = True, compact: bool = False,
    chunks: Optional[Sequence[int]] = None,
) -> ChunkGraph:
    """Slice the graph into chunk-local edge lists.

    Args:
        plan: The chunk plan.
        edge_index: The whole graph's edges ``(2, |E|)``.
        norm_keys: The normalisations the blocks' ``GCNConv(normalize=True)`` layers need
            (:func:`~lightning_gnnpipe.nn.gcn_norm.norm_keys`); ``gcn_norm`` is computed once on the full
            graph for each.
        device: Where the chunk graphs live.
        dtype: Dtype of the normalisation weights (the features' dtype).
        sparse: Also build every chunk's CSR adjacencies (raw and normalised), for the blocks that aggregate
            through a sparse-dense matmul (:func:`~lightning_gnnpipe.nn.sparse.sparse_capable`). Their indices are
            ``int32`` when the chunk fits (half the index memory; as fast on CPU).
        raw_adjacency: With ``sparse``, build the raw adjacencies too (``False``: every sparse conv normalises,
            :func:`~lightning_gnnpipe.nn.chunk_call.chunk_graph_options`); :attr:`ChunkGraph.adjacency` then holds
            ``None`` per chunk.
        norm_edge_lists: Keep the normalised edge lists (``False`` when only sparse blocks read the normalisation:
            :attr:`ChunkGraph.norm_edges` then holds empty dicts).
        compact: With ``sparse`` and neither ``raw_adjacency`` nor ``norm_edge_lists`` (every block is a
            normalising GCN layer on the sparse path, :func:`~lightning_gnnpipe.nn.chunk_call.chunk_graph_options`):
            keep only the sum operator of each normalised adjacency (:meth:`ChunkAdjacency.compact
            <lightning_gnnpipe.data.adjacency.ChunkAdjacency.compact>`) and no raw edge list
            (:attr:`ChunkGraph.edge_index` then holds empty ``(2, 0)`` tensors).
        chunks: Build halos and edges of these chunks only (hybrid parallelism: a partition's chunks); every
            other chunk gets its inner nodes, an empty halo and no edges (adjacencies ``None``). Default: all.

    Memory (bytes per local edge, kept): raw edge list 16; normalised edge list 20 per key; each CSR adjacency
    4 index arrays of 4 (``int32``) or 8 bytes, plus 8 for an operator's values. Compact: 16 per key (``int32``
    ``col`` and ``t_col``, two ``float32`` value arrays), nothing else per edge.
    """
    edge_index = edge_index.cpu()
    mine = set(range(plan.num_chunks)) if chunks is None else {int(c) for c in chunks}
    empty = edge_index.new_empty(2, 0)
    raw = [(local, eid) if c in mine else (empty, None) for c, (local, eid) in enumerate(plan.local_edges(edge_index))]
    keys = sorted(set(norm_keys))
    norm: List[Dict[NormKey, Tuple[Tensor, Tensor]]] = [{} for _ in range(plan.num_chunks)]
    for key in keys:
        loops = None if chunks is None or plan.degrees is None else \
            torch.cat([plan.nodes[c] for c in sorted(mine)]).sort().values
        ei_n, ew_n = full_graph_norm(edge_index, plan.num_nodes, key, dtype, plan.degrees, loops)
        for c, (local, eid) in enumerate(plan.local_edges(ei_n)):
            if c in mine:
                norm[c][key] = (local.to(device), ew_n[eid].to(device))
        del ei_n, ew_n
    graph = ChunkGraph(
        nodes=[n.to(device) for n in plan.nodes],
        halo=[h.to(device) if c in mine else h[:0].to(device) for c, h in enumerate(plan.halo)],
        edge_index=[local.to(device) for local, _ in raw],
        norm_edges=norm,
        max_chunk_size=plan.max_chunk_size,
    )
    del raw
    if sparse:
        graph.adjacency, graph.norm_adjacency = [], []
        for c in range(plan.num_chunks):
            if c not in mine:
                graph.adjacency.append(None)
                graph.norm_adjacency.append({})
                continue
            n_inner = int(plan.nodes[c].numel())
            n_local = n_inner + int(plan.halo[c].numel())
            small = max(n_local, graph.edge_index[c].size(1) + n_local) < 2**31
            adj, norm_adj = build_chunk_adjacency(graph.edge_index[c], n_inner, n_local, graph.norm_edges[c],
                                                  index_dtype=torch.int32 if small else torch.int64, raw=raw_adjacency)
            graph.adjacency.append(adj)
            graph.norm_adjacency.append(norm_adj)
            if not norm_edge_lists:
                graph.norm_edges[c] = {}
            if compact and not raw_adjacency and not norm_edge_lists:
                agg = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
                for a in norm_adj.values():
                    a.compact(agg)
                graph.edge_index[c] = graph.edge_index[c][:, :0].clone()
                graph.compacted = True
    return graph
