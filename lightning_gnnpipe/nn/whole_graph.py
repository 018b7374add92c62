"""The chunks' CSR operators side by side: one block call per layer for the exact whole-graph forward.

:meth:`~lightning_gnnpipe.nn.chunk_runner.ChunkRunner.run_full` computes a layer for the whole graph. Chunk by
chunk, each call reads a gathered copy of the chunk's local rows ``[inner; halo]`` (``n_c + h_c`` rows: on a graph
whose halos are about as large as the chunks, twice the graph's rows per layer). When a runner holds every chunk, its
rows are kept in chunk order (chunk 0's inner rows, then chunk 1's, ...); the chunks' operators ``adj_t``
``(n_c, n_c + h_c)`` then put side by side, with each local column renamed to its row's position, are one operator
``(|V|, |V|)`` of the whole graph in that order, and a block of known code runs once per layer on all rows, reading
no copy. Each row keeps its chunk's entries in their order, so the products are the per-chunk ones.

Only for the no-grad forward (evaluation, history refresh): the operator has no transpose for a backward pass.
Memory: each operator used (per normalisation or aggregation, and dtype) once more, ``E x (4 + 4)`` bytes with
``int32`` indices, kept for the fit.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from lightning_gnnpipe.data.adjacency import ChunkAdjacency, SparseAdjacency, _csr
from lightning_gnnpipe.data.chunk_graph import ChunkGraph


class WholeAdjacency:
    """The whole graph's adjacency in chunk order, from one :class:`~lightning_gnnpipe.data.adjacency.ChunkAdjacency`
    per chunk; read like one (``n_inner``, ``n_local``, ``num_edges``, :meth:`operator`).

    Args:
        parts: Per chunk in chunk order, its adjacency.
        columns: Per chunk, the position in chunk order of each of its local rows ``(n_c + h_c,)``.
    """

    def __init__(self, parts: Sequence[ChunkAdjacency], columns: Sequence[Tensor]) -> None:
        self.parts, self.columns = list(parts), list(columns)
        self.n_inner = self.n_local = sum(p.n_inner for p in self.parts)
        self.num_edges = sum(p.num_edges for p in self.parts)
        self._cache: Dict[Tuple[bool, torch.dtype], SparseAdjacency] = {}

    def operator(self, dtype: torch.dtype = torch.float32, mean: bool = False,
                 edge_weight: Optional[Tensor] = None) -> SparseAdjacency:
        """The chunks' operators ``(mean, dtype)`` side by side ``(|V|, |V|)``, built once (forward only).

        Raises:
            RuntimeError: ``edge_weight`` given, or autograd on (no transpose for a backward pass); as
                :meth:`ChunkAdjacency.operator <lightning_gnnpipe.data.adjacency.ChunkAdjacency.operator>`.
        """
        if edge_weight is not None or torch.is_grad_enabled():
            raise RuntimeError("WholeAdjacency.operator: forward only, without per-call edge weights (got "
                               f"edge_weight={'given' if edge_weight is not None else None}, autograd "
                               f"{'on' if torch.is_grad_enabled() else 'off'}).")
        key = (bool(mean), dtype)
        if key not in self._cache:
            ops = [p.operator(dtype, mean).adj_t for p in self.parts]
            wide = self.n_local >= 2**31 or self.num_edges >= 2**31
            index = torch.int64 if wide else torch.int32
            crows, offset = [], 0
            for op in ops:
                crow = op.crow_indices()
                crows.append(crow[:-1].to(index) + offset)
                offset += int(crow[-1])
            crows.append(torch.tensor([offset], dtype=index, device=crows[0].device))
            col = torch.cat([m.to(index).index_select(0, op.col_indices().long())
                             for m, op in zip(self.columns, ops)])
            adj_t = _csr(torch.cat(crows), col, torch.cat([op.values() for op in ops]), (self.n_inner, self.n_local))
            self._cache[key] = SparseAdjacency(adj_t, adj_t)  # no transpose: never differentiated
        return self._cache[key]


class WholeGraph:
    """The graph of a runner that holds every chunk, as one chunk in chunk order: what
    :func:`~lightning_gnnpipe.nn.sparse.sparse_aggregation` reads.

    Args:
        graph: The chunk graphs (built with ``sparse=True``).
        chunks: The chunks, in the order their rows take.
        halo_positions: Per chunk of ``graph``, the position in chunk order of each halo row ``(h_c,)``.
        bounds: Per chunk of ``chunks``, its rows' slice ``[a, b)`` in chunk order.

    Attributes:
        edge_index: ``(2, E)``, a stand-in that allocates nothing (every entry ``-1``): the convs aggregate through the
            operators, and a conv that would pass messages along it instead fails
            (:func:`~lightning_gnnpipe.nn.sparse.sparse_aggregation` with ``edge_list_fallback=False``).
        adjacency: The raw adjacency (``None`` when the graph has none).
        norm_adjacency: Per normalisation key, the normalised adjacency.
    """

    def __init__(self, graph: ChunkGraph, chunks: Sequence[int], halo_positions: Sequence[Tensor],
                 bounds: Sequence[Tuple[int, int]]) -> None:
        device = graph.nodes[0].device
        columns: List[Tensor] = [torch.cat([torch.arange(a, b, device=device), halo_positions[c]])
                                 for c, (a, b) in zip(chunks, bounds)]
        raw = graph.adjacency
        self.adjacency = None if raw is None or any(raw[c] is None for c in chunks) else \
            WholeAdjacency([raw[c] for c in chunks], columns)  # type: ignore[misc]
        norm = graph.norm_adjacency or []
        keys = set(norm[chunks[0]]) if norm else set()
        self.norm_adjacency: Dict = {k: WholeAdjacency([norm[c][k] for c in chunks], columns) for k in keys}
        edges = self.adjacency.num_edges if self.adjacency is not None else 0
        self.edge_index = torch.full((2, 1), -1, dtype=torch.long, device=device).expand(2, edges)
