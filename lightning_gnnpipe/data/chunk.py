"""Graph chunks: inner nodes, halo nodes and chunk-local edges (the pipeline micro-batches).

GNNPipe (arXiv 2308.10087, Sec. 4.1) feeds the pipeline one chunk at a time. A chunk is a
METIS part (its *inner* nodes) plus its *halo*: the out-of-chunk sources of edges that end
at an inner node. Every edge belongs to exactly one chunk, the chunk of its target node.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from lightning_gnnpipe.data.partition import edge_cut, metis_partition


@dataclass
class ChunkPlan:
    """How a graph is cut into ``K`` chunks, with every chunk's inner and halo nodes.

    Attributes:
        part: Chunk id of every node, shape ``(|V|,)``.
        nodes: Per chunk, its inner node ids, sorted, shape ``(n_c,)``.
        halo: Per chunk, its halo node ids (out-of-chunk in-neighbours), sorted, ``(h_c,)``.
        edge_cut: Fraction of edges between two chunks (unitless).
        degrees: ``None`` for a plan whose edge lists are the whole graph's. A plan loaded for one partition
            (:mod:`~lightning_gnnpipe.data.partitioned`), whose edge lists hold only the edges into that partition,
            carries the whole graph's in-degrees ``(|V|,)`` without and with self loops, from which GCN's
            full-graph normalisation is computed (:func:`~lightning_gnnpipe.data.chunk_graph.full_graph_norm`).

    Local ids: inside chunk ``c`` the inner node ``nodes[c][i]`` has local id ``i`` and the
    halo node ``halo[c][j]`` has local id ``n_c + j``.
    """

    part: Tensor
    nodes: List[Tensor]
    halo: List[Tensor]
    edge_cut: float
    degrees: Optional[Tuple[Tensor, Tensor]] = None

    @property
    def num_chunks(self) -> int:
        return len(self.nodes)

    @property
    def num_nodes(self) -> int:
        return self.part.numel()

    @property
    def chunk_sizes(self) -> List[int]:
        return [int(n.numel()) for n in self.nodes]

    @property
    def max_chunk_size(self) -> int:
        """Rows ``M`` every micro-batch is padded to (the largest chunk)."""
        return max(self.chunk_sizes)

    def local_index(self, c: int, out: Optional[Tensor] = None) -> Tensor:
        """Map global node id to chunk ``c``'s local id (``-1`` outside chunk and halo), ``(|V|,)``.

        Built on demand and not kept (``K`` such maps would hold ``K |V|`` ids). ``out``: a ``(|V|,)`` buffer
        filled with ``-1`` to write into (then reset by the caller), instead of a new one.
        """
        local = torch.full((self.num_nodes,), -1, dtype=torch.long) if out is None else out
        local[self.nodes[c]] = torch.arange(self.nodes[c].numel())
        local[self.halo[c]] = self.nodes[c].numel() + torch.arange(self.halo[c].numel())
        return local

    def local_edges(self, edge_index: Tensor) -> List[Tuple[Tensor, Tensor]]:
        """Split edges by the chunk of their target and relabel them to local ids.

        Args:
            edge_index: Edges ``(2, |E|)`` of the same graph (it may add self-loops, it must not
                add edges from outside a chunk's halo).

        Returns:
            Per chunk, ``(local_edge_index (2, E_c), edge_id (E_c,))`` where ``edge_id`` indexes
            the columns of ``edge_index``, in their original order.

        Raises:
            ValueError: If an edge comes from a node that is neither inner nor halo.
        """
        dst_chunk = self.part[edge_index[1]]
        order = torch.sort(dst_chunk, stable=True).indices  # edges grouped by target chunk, original order kept
        counts = torch.bincount(dst_chunk, minlength=self.num_chunks).tolist()
        del dst_chunk
        buffer = torch.full((self.num_nodes,), -1, dtype=torch.long)  # one |V| map, reused for every chunk
        out = []
        for c, eid in enumerate(torch.split(order, counts)):
            local = self.local_index(c, out=buffer)[edge_index[:, eid]]
            buffer[self.nodes[c]] = -1
            buffer[self.halo[c]] = -1
            if local.numel() and int(local.min()) < 0:
                raise ValueError(
                    f"ChunkPlan.local_edges: chunk {c} receives an edge from a node outside its "
                    "halo. Build the plan from the same graph."
                )
            out.append((local, eid.clone()))
        return out

    def pad(self, x: Tensor) -> Tensor:
        """Stack the chunks' rows of ``x`` ``(|V|, F)`` into ``(K * M, F)``, zero padded."""
        m = self.max_chunk_size
        out = x.new_zeros((self.num_chunks * m,) + tuple(x.shape[1:]))
        for c, nodes in enumerate(self.nodes):
            out[c * m: c * m + nodes.numel()] = x[nodes]
        return out

    def reordered(self, order: List[int]) -> "ChunkPlan":
        """Return the plan with chunks renumbered so that chunk ``order[i]`` becomes chunk ``i``.

        Args:
            order: A permutation of ``range(K)``.

        Raises:
            ValueError: If ``order`` is not a permutation of ``range(K)``.
        """
        if sorted(order) != list(range(self.num_chunks)):
            raise ValueError(f"ChunkPlan.reordered: `order` must be a permutation of range({self.num_chunks}) "
                             f"(got {order}).")
        position = torch.empty(self.num_chunks, dtype=torch.long)
        position[torch.tensor(order)] = torch.arange(self.num_chunks)
        return ChunkPlan(part=position[self.part], nodes=[self.nodes[c] for c in order],
                         halo=[self.halo[c] for c in order], edge_cut=self.edge_cut, degrees=self.degrees)

    def fingerprint(self) -> str:
        """Return a short hash of the chunk assignment (to check that all ranks agree)."""
        return hashlib.sha1(self.part.numpy().tobytes()).hexdigest()[:16]


def build_chunk_plan(
    edge_index: Tensor, num_nodes: int, num_chunks: int, part: Optional[Tensor] = None
) -> ChunkPlan:
    """Cut a graph into chunks with METIS and compute each chunk's halo.

    Args:
        edge_index: Edges ``(2, |E|)``, source row first (messages flow source -> target).
        num_nodes: Number of nodes ``|V|``.
        num_chunks: Number of chunks ``K``.
        part: Optional precomputed chunk id per node ``(|V|,)``; METIS runs when ``None``.

    Returns:
        The :class:`ChunkPlan`.

    Raises:
        ValueError: If ``part`` is ``None`` and ``num_chunks`` is not in ``[1, |V|]``
            (:func:`~lightning_gnnpipe.data.partition.metis_partition`).
    """
    if part is None:
        part = metis_partition(edge_index, num_nodes, num_chunks)
    src, dst = edge_index
    cross = part[src] != part[dst]
    nodes, halo = [], []
    for c in range(num_chunks):
        nodes.append((part == c).nonzero().view(-1))
        halo.append(torch.unique(src[cross & (part[dst] == c)]))
    return ChunkPlan(part=part, nodes=nodes, halo=halo, edge_cut=edge_cut(edge_index, part))
