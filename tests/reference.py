"""Single-process references, written independently of the package's stage code.

``chunked_reference`` runs the GNNPipe fresh/stale rule the plain way: for chunk ``c`` and
layer ``l`` it takes the layer's history table, puts the chunk's current rows in, runs the
user's *unsplit* layer on the whole graph (so PyG computes the full-graph normalisation
itself) and keeps the chunk's rows. It shares no code with ``GNNStage``.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Collection, List, Optional

import torch
import torch.nn.functional as F
from torch_geometric.data import Data

from lightning_gnnpipe.data.chunk import ChunkPlan


def gcn_layer(gnn, layer: int, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
    """Layer ``layer`` of a PyG ``GCN`` without norm/dropout: conv, then ReLU unless last."""
    h = gnn.convs[layer](x, edge_index)
    return h if layer == gnn.num_layers - 1 else F.relu(h)


def call_layer(layer: Callable, x: torch.Tensor, edge_index: torch.Tensor, x0: Optional[torch.Tensor]) -> torch.Tensor:
    """``layer(x, edge_index)``, or ``layer(x, edge_index, x0)`` for a GCNII-style layer (``takes_x0 = True``)."""
    return layer(x, edge_index, x0) if getattr(layer, "takes_x0", False) else layer(x, edge_index)


@torch.no_grad()
def exact_inputs(layers: List[Callable], data: Data) -> List[torch.Tensor]:
    """Every layer's exact input embeddings ``(|V|, d_l)`` under the current weights."""
    h, x0, out = data.x, None, []
    for i, layer in enumerate(layers):
        out.append(h.clone())
        h = call_layer(layer, h, data.edge_index, x0)
        x0 = h if i == 0 else x0
    return out


def chunked_reference(module, data: Data, plan: ChunkPlan, epochs: int, refresh_on_start: bool = True,
                      refresh_every: int = 0, momentum: float = 0.0, stale_halo_grads: bool = False,
                      layers: Optional[List[Callable]] = None, num_parts: int = 1,
                      refresh_at: Collection[int] = (), table_dtype: Optional[torch.dtype] = None,
                      groups: Optional[Callable[[int], List[List[int]]]] = None,
                      wrong_read: bool = False) -> List[float]:
    """Train ``module`` (a ``GCNModule``) with the chunked algorithm in one process.

    ``layers`` are the model's layers as ``layer(x, edge_index)`` callables (default: the
    layers of the PyG ``GCN`` at ``module.gnn``); a layer with ``takes_x0 = True`` is called
    ``layer(x, edge_index, x0)`` with layer 0's output (GCNII).

    ``refresh_at``: epochs at whose start the tables are also refilled exactly with the current weights (what a
    resume from a checkpoint without history tables does at the resume epoch).

    ``num_parts = G > 1`` runs hybrid parallelism's rule: chunk ``j * G + g`` is partition ``g``'s
    ``j``-th chunk, the ``G`` chunks of slot ``j`` go through each layer together and read each
    other's rows live (with gradient); other rows come from the tables (fresh if written earlier).

    ``table_dtype``: the tables of layers >= 1 hold their rows rounded to this dtype (kept in float32 here).

    ``groups(epoch)``: several optimizer steps an epoch, one per group of chunk ids (in the order given; with
    ``G > 1`` whole slots); each step's loss is the cross-entropy over the labelled nodes of its chunks, and the
    tables keep what the chunks wrote in earlier steps. ``None``: one step of every chunk.

    ``wrong_read``: a deliberately wrong history read: every chunk reads the tables as they were when its step
    began, not the rows that the chunks before it in the same step wrote (for showing that a test can fail).

    Returns the training loss of every epoch (as the user's ``training_step`` computes it from the chunked output;
    with ``groups`` the mean over the epoch's steps, as Lightning's ``on_epoch`` logging takes it).
    """
    gnn = module.gnn
    if layers is None:
        layers = [partial(gcn_layer, gnn, layer) for layer in range(gnn.num_layers)]
    L, N = len(layers), data.num_nodes
    opt = module.configure_optimizers()
    slots_of = groups or (lambda epoch: [list(range(plan.num_chunks))])

    def stored(t: torch.Tensor) -> torch.Tensor:  # what a table of `table_dtype` keeps of `t`
        return t if table_dtype is None else t.to(table_dtype).to(t.dtype)

    def refreshed() -> List[torch.Tensor]:  # layer 0's halo rows are the features themselves
        return [t if layer == 0 else stored(t) for layer, t in enumerate(exact_inputs(layers, data))]

    tables = refreshed()
    if not refresh_on_start:
        tables = [t if layer == 0 else torch.zeros_like(t) for layer, t in enumerate(tables)]
    collected = [torch.zeros_like(t) for t in tables]
    losses = []
    for epoch in range(epochs):
        if (refresh_every and epoch > 0 and epoch % refresh_every == 0) or epoch in refresh_at:
            tables = refreshed()
        applied, collected = collected, [torch.zeros_like(t) for t in tables]
        step_losses = []
        for group in slots_of(epoch):
            opt.zero_grad()
            outs, order = [], []
            begun = [t.clone() for t in tables] if wrong_read else None
            slots = list(dict.fromkeys(c // num_parts for c in group))  # the group's slots, in its order
            for slot in slots:
                chunks = list(range(slot * num_parts, (slot + 1) * num_parts))
                nodes = [plan.nodes[c] for c in chunks]
                hs = [data.x[n] for n in nodes]
                h0s: List[torch.Tensor] = []  # the slot's rows of layer 0's output (GCNII's initial embedding)
                for layer in range(L):
                    if layer > 0:
                        with torch.no_grad():
                            for n, h in zip(nodes, hs):
                                tables[layer][n] = stored(momentum * tables[layer][n] + (1 - momentum) * h)
                    table = tables[layer].clone() if begun is None else begun[layer].clone()
                    if stale_halo_grads and layer > 0:
                        table.requires_grad_(True)
                        table.register_hook(lambda g, layer=layer: collected[layer].add_(g))
                        hs = [h + 0 for h in hs]
                        for n, h in zip(nodes, hs):
                            h.register_hook(lambda g, extra=applied[layer][n]: g + extra)
                    # the slot's rows carry their gradient (in hybrid parallelism across partitions too)
                    mixed = table.index_put((torch.cat(nodes),), torch.cat(hs))
                    x0 = None  # only the slot's own rows of x0 reach its outputs: zeros elsewhere
                    if h0s:
                        x0 = torch.zeros(N, h0s[0].size(-1)).index_put((torch.cat(nodes),), torch.cat(h0s))
                    out = call_layer(layers[layer], mixed, data.edge_index, x0)
                    hs = [out[n] for n in nodes]
                    h0s = hs if layer == 0 else h0s
                outs += hs
                order += nodes
            index = torch.cat(order)
            full = torch.zeros(N, outs[0].size(-1)).index_put((index,), torch.cat(outs))
            mask = data.train_mask & torch.zeros(N, dtype=torch.bool).index_fill(0, index, True)
            loss = F.cross_entropy(full[mask], data.y[mask])
            loss.backward()
            opt.step()
            step_losses.append(float(loss.detach()))
        losses.append(sum(step_losses) / len(step_losses))
    return losses


def layer_major_reference(module, data: Data, plan: ChunkPlan, epochs: int, refresh_every: int = 0,
                          halo_gradients: str = "detach", layers: Optional[List[Callable]] = None) -> List[float]:
    """The GNNPipe rule computed layer by layer over all chunks (one partition, no momentum), written apart from
    :func:`chunked_reference`: at layer ``l`` chunk ``c`` reads the rows of the chunks before it as they are this
    epoch (detached), those of the chunks after it from last epoch's values (the table). With
    ``halo_gradients="fresh"`` the rows read from the table pass their gradient straight to the owner chunk's rows of
    this epoch (their value stays the table's), those read fresh pass none, and the chunks go in reverse order in odd
    epochs. Returns every epoch's full-graph loss."""
    gnn = module.gnn
    if layers is None:
        layers = [partial(gcn_layer, gnn, layer) for layer in range(gnn.num_layers)]
    n, k, opt = data.num_nodes, plan.num_chunks, module.configure_optimizers()
    nodes = plan.nodes
    tables = exact_inputs(layers, data)
    losses = []
    for epoch in range(epochs):
        if refresh_every and epoch > 0 and epoch % refresh_every == 0:
            tables = exact_inputs(layers, data)
        opt.zero_grad()
        hs, x0 = [data.x[nodes[c]] for c in range(k)], None
        turn = list(range(k))[::-1] if halo_gradients == "fresh" and epoch % 2 else list(range(k))  # chunk -> turn
        for layer, fn in enumerate(layers):
            out = []
            for c in range(k):
                mixed = tables[layer].clone()
                for other in range(k):
                    if turn[other] < turn[c]:
                        mixed[nodes[other]] = hs[other].detach()
                    elif turn[other] > turn[c] and layer > 0 and halo_gradients == "fresh":
                        mixed[nodes[other]] = mixed[nodes[other]] + hs[other] - hs[other].detach()
                mixed[nodes[c]] = hs[c]
                out.append(call_layer(fn, mixed, data.edge_index, x0)[nodes[c]])
            with torch.no_grad():
                for c in range(k):
                    tables[layer][nodes[c]] = hs[c]
            hs = out
            if layer == 0:
                x0 = torch.zeros(n, hs[0].size(-1)).index_put((torch.cat(nodes),), torch.cat(hs))
        full = torch.zeros(n, hs[0].size(-1)).index_put((torch.cat(nodes),), torch.cat(hs))
        loss = F.cross_entropy(full[data.train_mask], data.y[data.train_mask])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses
