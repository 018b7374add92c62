"""METIS partitioning of a graph into chunks (min edge cut).

Source: G. Karypis and V. Kumar, "A fast and high quality multilevel scheme for partitioning
irregular graphs", SIAM J. Sci. Comput. 1998, through the ``pymetis`` bindings. GNNPipe
(arXiv 2308.10087, Sec. 4) cuts the graph with METIS so that chunks share few edges.
"""

from __future__ import annotations

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
    _, membership = pymetis.part_graph(
        num_parts, xadj=rowptr.tolist(), adjncy=ei[1].tolist()
    )
    part = torch.as_tensor(membership, dtype=torch.long)
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
