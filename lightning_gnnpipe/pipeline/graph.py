"""Per-chunk local graphs a stage needs: raw edges and full-graph-normalised edges."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch
from torch import Tensor, nn

from lightning_gnnpipe.data.chunk import ChunkPlan
from lightning_gnnpipe.nn.normalization import NormKey, full_graph_norm, norm_key, normalized_convs


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
    """

    nodes: List[Tensor]
    halo: List[Tensor]
    edge_index: List[Tensor]
    norm_edges: List[Dict[NormKey, Tuple[Tensor, Tensor]]]
    max_chunk_size: int

    @property
    def num_chunks(self) -> int:
        return len(self.nodes)


def build_chunk_graph(
    plan: ChunkPlan, edge_index: Tensor, blocks: List[nn.Module], device: torch.device, dtype=torch.float32
) -> ChunkGraph:
    """Slice the graph into chunk-local edge lists for the given blocks.

    ``gcn_norm`` is computed once on the full graph for every distinct
    ``(improved, add_self_loops)`` among the blocks' ``GCNConv(normalize=True)`` layers.
    """
    edge_index = edge_index.cpu()
    raw = plan.local_edges(edge_index)
    keys = {norm_key(c) for b in blocks for c in normalized_convs(b)}
    norm: List[Dict[NormKey, Tuple[Tensor, Tensor]]] = [{} for _ in range(plan.num_chunks)]
    for key in keys:
        ei_n, ew_n = full_graph_norm(edge_index, plan.num_nodes, key, dtype)
        for c, (local, eid) in enumerate(plan.local_edges(ei_n)):
            norm[c][key] = (local.to(device), ew_n[eid].to(device))
    return ChunkGraph(
        nodes=[n.to(device) for n in plan.nodes],
        halo=[h.to(device) for h in plan.halo],
        edge_index=[local.to(device) for local, _ in raw],
        norm_edges=norm,
        max_chunk_size=plan.max_chunk_size,
    )
