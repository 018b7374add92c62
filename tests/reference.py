"""Single-process references, written independently of the package's stage code.

``chunked_reference`` runs the GNNPipe fresh/stale rule the plain way: for chunk ``c`` and
layer ``l`` it takes the layer's history table, puts the chunk's current rows in, runs the
user's *unsplit* layer on the whole graph (so PyG computes the full-graph normalisation
itself) and keeps the chunk's rows. It shares no code with ``GNNStage``.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, List, Optional

import torch
import torch.nn.functional as F
from torch_geometric.data import Data

from lightning_gnnpipe.data.chunk import ChunkPlan


def gcn_layer(gnn, layer: int, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
    """Layer ``layer`` of a PyG ``GCN`` without norm/dropout: conv, then ReLU unless last."""
    h = gnn.convs[layer](x, edge_index)
    return h if layer == gnn.num_layers - 1 else F.relu(h)


def chunked_reference(module, data: Data, plan: ChunkPlan, epochs: int, refresh_on_start: bool = True,
                      layers: Optional[List[Callable]] = None) -> List[float]:
    """Train ``module`` (a ``GCNModule``) with the chunked algorithm in one process.

    ``layers`` are the model's layers as ``layer(x, edge_index)`` callables (default: the
    layers of the PyG ``GCN`` at ``module.gnn``).

    Returns the full-graph training loss of every epoch (as the user's ``training_step``
    computes it from the chunked output).
    """
    gnn = module.gnn
    if layers is None:
        layers = [partial(gcn_layer, gnn, layer) for layer in range(gnn.num_layers)]
    L, N = len(layers), data.num_nodes
    opt = module.configure_optimizers()
    tables: List[torch.Tensor] = []
    with torch.no_grad():
        h = data.x
        for layer in range(L):
            tables.append(h.clone() if (refresh_on_start or layer == 0) else torch.zeros_like(h))
            h = layers[layer](h, data.edge_index)
    losses = []
    for _ in range(epochs):
        opt.zero_grad()
        outs = []
        for c in range(plan.num_chunks):
            nodes = plan.nodes[c]
            h = data.x[nodes]
            for layer in range(L):
                if layer > 0:
                    tables[layer][nodes] = h.detach()
                mixed = tables[layer].index_put((nodes,), h)  # differentiable in the chunk's rows only
                h = layers[layer](mixed, data.edge_index)[nodes]
            outs.append(h)
        full = torch.zeros(N, outs[0].size(-1)).index_put(
            (torch.cat(list(plan.nodes)),), torch.cat(outs)
        )
        loss = F.cross_entropy(full[data.train_mask], data.y[data.train_mask])
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses
