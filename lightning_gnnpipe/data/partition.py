"""METIS partitioning of a graph into chunks (min edge cut).

Source: G. Karypis and V. Kumar, "A fast and high quality multilevel scheme for partitioning
irregular graphs", SIAM J. Sci. Comput. 1998, through the ``pymetis`` bindings. GNNPipe
(arXiv 2308.10087, Sec. 4) cuts the graph with METIS so that chunks share few edges.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch_geometric.utils import to_undirected


def metis_partition(edge_index: Tensor, num_nodes: int, num_parts: int) -> Tensor:
    """Partition a graph into ``num_parts`` parts of about equal size with minimal edge cut.

    The graph is symmetrised and its self-loops dropped for partitioning only; the message
    direction of ``edge_index`` is not changed anywhere else. Parts that METIS leaves empty
    (it can, on tiny or disconnected graphs) are filled by moving nodes from the largest part,
    so every returned part holds at least one node.

    Args:
        edge_index: Edges ``(2, |E|)``, ``torch.long``, source row first.
        num_nodes: Number of nodes ``|V|``.
        num_parts: Number of parts ``K``, ``1 <= K <= |V|``.

    Returns:
        Part id of every node, shape ``(|V|,)``, ``torch.long``, values in ``[0, K)``.

    Raises:
        ValueError: If ``num_parts`` is not in ``[1, num_nodes]``.
    """
    if not 1 <= num_parts <= num_nodes:
        raise ValueError(
            f"metis_partition: `num_parts` must be in [1, {num_nodes}] (the number of nodes) "
            f"(got {num_parts}). Use fewer parts."
        )
    if num_parts == 1:
        return torch.zeros(num_nodes, dtype=torch.long)

    import pymetis

    ei = edge_index[:, edge_index[0] != edge_index[1]]
    ei = to_undirected(ei, num_nodes=num_nodes)  # sorted by row, deduplicated
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.long)
    rowptr[1:] = torch.bincount(ei[0], minlength=num_nodes).cumsum(0)
    # numpy arrays in pymetis's own index dtype are passed without a copy (Python lists cost ~36 bytes an edge)
    dtype = pymetis.zero_copy_dtype()
    adjacency = pymetis.CSRAdjacency(rowptr.numpy().astype(dtype, copy=False), ei[1].numpy().astype(dtype, copy=False))
    del ei
    membership = pymetis.part_graph(num_parts, adjacency=adjacency).vertex_part
    part = torch.as_tensor(np.asarray(membership), dtype=torch.long)
    return _fill_empty_parts(part, num_parts)


def _fill_empty_parts(part: Tensor, num_parts: int) -> Tensor:
    """Move one node at a time from the largest part into each empty part."""
    part = part.clone()
    sizes = torch.bincount(part, minlength=num_parts)
    for empty in (sizes == 0).nonzero().view(-1).tolist():
        largest = int(sizes.argmax())
        node = int((part == largest).nonzero()[-1])
        part[node] = empty
        sizes[largest] -= 1
        sizes[empty] += 1
    return part


def edge_cut(edge_index: Tensor, part: Tensor) -> float:
    """Return the fraction of edges whose two end points lie in different parts (unitless)."""
    if edge_index.numel() == 0:
        return 0.0
    return float((part[edge_index[0]] != part[edge_index[1]]).float().mean())


def nested_partition(edge_index: Tensor, num_nodes: int, num_parts: int, chunks_per_part: int) -> Tensor:
    """Cut a graph into ``G`` partitions, then every partition into ``K/G`` chunks (hybrid parallelism).

    METIS first splits the whole graph into ``num_parts`` partitions (min edge cut), then splits each
    partition's induced subgraph into ``chunks_per_part`` chunks. Chunk ``j`` of partition ``g`` gets the
    id ``j * num_parts + g`` ("slot-major": the chunks of one pipeline slot ``j`` are consecutive).

    Args:
        edge_index: Edges ``(2, |E|)``.
        num_nodes: ``|V|``.
        num_parts: ``G`` partitions (graph-parallel groups), ``>= 1``.
        chunks_per_part: Chunks per partition, ``>= 1``; every partition needs at least that many nodes.

    Returns:
        Chunk id of every node ``(|V|,)``, ``torch.long`` in ``[0, G * chunks_per_part)``.

    Raises:
        ValueError: If a partition has fewer nodes than ``chunks_per_part``.
    """
    from torch_geometric.utils import subgraph

    parts = metis_partition(edge_index, num_nodes, num_parts)
    chunk = torch.empty(num_nodes, dtype=torch.long)
    for g in range(num_parts):
        members = (parts == g).nonzero().view(-1)
        if members.numel() < chunks_per_part:
            raise ValueError(
                f"nested_partition: partition {g} has {members.numel()} nodes, fewer than the {chunks_per_part} "
                "chunks per partition requested. Use fewer chunks or fewer partitions."
            )
        sub, _ = subgraph(members, edge_index, relabel_nodes=True, num_nodes=num_nodes)
        local = metis_partition(sub, members.numel(), chunks_per_part)
        chunk[members] = local * num_parts + g
    return chunk
