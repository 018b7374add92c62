"""Feed full-graph degree normalisation to the convs that a chunk would get wrong.

``GCNConv(normalize=True)`` (and ``GCN2Conv``) computes ``D^-1/2 (A + I) D^-1/2`` from the degrees of the graph
it is given. On a chunk's local graph a halo node has only its chunk-local edges, so its
degree is wrong. GNNPipe needs the full-graph coefficients (arXiv 2308.10087, Sec. 4.1): they are
computed once on the whole graph (:mod:`~lightning_gnnpipe.data.chunk_graph`), sliced per chunk, and fed to the
conv while a chunk runs. The conv is wrapped for the
duration of one call (its ``forward`` is swapped and restored); its parameters and flags
stay untouched.

Convs that propagate several hops inside one layer cannot be served by a 1-hop halo and are
refused.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Dict, Iterator, List, Set, Tuple

from torch import Tensor, nn
import torch
from torch_geometric.nn import APPNP, ChebConv, GCN2Conv, GCNConv, SGConv, SSGConv, TAGConv

from lightning_gnnpipe.data.chunk_graph import NormKey, full_graph_norm  # noqa: F401  (full_graph_norm: re-export)
from lightning_gnnpipe.nn.forward_swap import swapped_forward

MULTI_HOP = (SGConv, SSGConv, TAGConv, ChebConv, APPNP)


def normalized_convs(block: nn.Module) -> List[nn.Module]:
    """Return the ``GCNConv``/``GCN2Conv`` modules of a block with ``normalize=True``."""
    return [m for m in block.modules() if isinstance(m, (GCNConv, GCN2Conv)) and m.normalize]


def norm_key(conv: nn.Module) -> NormKey:
    """Return the ``(improved, add_self_loops)`` normalisation a conv needs."""
    return (bool(getattr(conv, "improved", False)), bool(conv.add_self_loops))


def norm_keys(blocks: List[nn.Module]) -> Set[NormKey]:
    """Return every normalisation that the blocks' ``GCNConv``/``GCN2Conv(normalize=True)`` layers need."""
    return {norm_key(c) for b in blocks for c in normalized_convs(b)}


def check_one_hop(blocks: List[nn.Module]) -> None:
    """Refuse convs whose receptive field is wider than one hop.

    Raises:
        ValueError: If a block holds ``SGConv``/``SSGConv``/``TAGConv``/``ChebConv``/``APPNP``
            with ``K > 1``.
    """
    for i, block in enumerate(blocks):
        for m in block.modules():
            if isinstance(m, MULTI_HOP) and int(getattr(m, "K", 1)) > 1:
                raise ValueError(
                    f"check_one_hop: layer {i} holds {type(m).__name__}(K={m.K}), which propagates "
                    f"{m.K} hops inside one layer; a chunk carries a 1-hop halo (got K={m.K}). "
                    "Use K=1 layers stacked K times."
                )


def _edge_list_gcn(conv: GCNConv, edge_index: Tensor, edge_weight: Tensor, x: Tensor, *_, **__) -> Tensor:
    # GCNConv.forward with normalize=False on precomputed full-graph coefficients.
    out = conv.propagate(edge_index, x=conv.lin(x), edge_weight=edge_weight)
    return out if conv.bias is None else out + conv.bias


def _edge_list_gcn2(conv: GCN2Conv, edge_index: Tensor, edge_weight: Tensor, x: Tensor, x_0: Tensor,
                  *_, **__) -> Tensor:
    # GCN2Conv.forward (torch_geometric 2.8) with normalize=False on precomputed coefficients.
    return gcn2_mix(conv, conv.propagate(edge_index, x=x, edge_weight=edge_weight), x_0)


def gcn2_mix(conv: GCN2Conv, aggregated: Tensor, x_0: Tensor) -> Tensor:
    """The rest of ``GCN2Conv.forward`` (torch_geometric 2.8) after the aggregation ``(n, d)``: initial residual
    and identity mapping (``x_0`` is cut to the aggregated rows). ``aggregated`` must be a tensor of the caller's own
    (an aggregation's output): as PyG's forward does, it is scaled and added to in place (no backward needs it)."""
    x = aggregated.mul_(1 - conv.alpha)
    x_0 = conv.alpha * x_0[: x.size(0)]
    if conv.weight2 is None:
        out = x.add_(x_0)
        return torch.addmm(out, out, conv.weight1, beta=1.0 - conv.beta, alpha=conv.beta)
    out = torch.addmm(x, x, conv.weight1, beta=1.0 - conv.beta, alpha=conv.beta)
    return out + torch.addmm(x_0, x_0, conv.weight2, beta=1.0 - conv.beta, alpha=conv.beta)


@contextmanager
def precomputed_norm(
    convs: List[nn.Module], edges: Dict[NormKey, Tuple[Tensor, Tensor]]
) -> Iterator[None]:
    """Run ``convs`` on the given chunk-local normalised edges, ignoring the ones passed in."""
    swaps = []
    for conv in convs:
        ei, ew = edges[norm_key(conv)]
        if isinstance(conv, GCN2Conv):
            swaps.append((conv, lambda x, x_0, *a, _c=conv, _ei=ei, _ew=ew, **k:
                          _edge_list_gcn2(_c, _ei, _ew, x, x_0)))
        else:
            swaps.append((conv, lambda x, *a, _c=conv, _ei=ei, _ew=ew, **k: _edge_list_gcn(_c, _ei, _ew, x)))
    with swapped_forward(swaps):
        yield
