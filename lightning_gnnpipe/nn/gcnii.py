"""GCNII as a pipeline-ready stack of blocks.

GCNII (Chen et al., "Simple and Deep Graph Convolutional Networks", ICML 2020, arXiv 2007.02133) mixes the initial
embedding ``h0`` into every layer. Under GNNPipe ``h0`` (the output of block 0) travels through every stage beside
``h``; blocks that need it declare ``takes_x0 = True`` (see ``docs/custom_models.md``). Follows PyG's
``examples/gcn2_cora.py``.
"""

from __future__ import annotations

from typing import List

import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GCN2Conv

from lightning_gnnpipe.nn.dropout import make_dropout as _dropout


class _Input(nn.Module):
    def __init__(self, in_channels: int, hidden: int, dropout: float, node_dropout: bool = False) -> None:
        super().__init__()
        self.lin, self.drop = nn.Linear(in_channels, hidden), _dropout(dropout, node_dropout)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return F.relu(self.lin(self.drop(x)))


class GCNIILayer(nn.Module):
    """One GCNII layer: dropout, ``GCN2Conv(x, x0)``, ReLU. Called ``(x, edge_index, x0)``."""

    takes_x0 = True

    def __init__(self, hidden: int, alpha: float, theta: float, layer: int, dropout: float,
                 node_dropout: bool = False) -> None:
        super().__init__()
        self.conv = GCN2Conv(hidden, alpha, theta, layer, shared_weights=True, normalize=True)
        self.drop = _dropout(dropout, node_dropout)

    def forward(self, x: Tensor, edge_index: Tensor, x0: Tensor) -> Tensor:
        return F.relu(self.conv(self.drop(x), x0, edge_index))


class _Output(nn.Module):
    def __init__(self, hidden: int, out_channels: int, dropout: float, node_dropout: bool = False) -> None:
        super().__init__()
        self.lin, self.drop = nn.Linear(hidden, out_channels), _dropout(dropout, node_dropout)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.lin(self.drop(x))


class GCNII(nn.Module):
    """``num_layers`` GCNII layers between an input and an output linear layer.

    Args:
        in_channels: Input features ``F``.
        hidden: Width of every GCNII layer.
        out_channels: Classes ``C``.
        num_layers: GCNII layers (the pipeline sees ``num_layers + 2`` blocks).
        alpha: Initial-residual weight.
        theta: Identity-mapping strength (``beta_l = log(theta / l + 1)``).
        dropout: Dropout probability before every layer.
        node_dropout: Use :class:`~lightning_gnnpipe.nn.NodeDropout` (one mask per node and epoch, the same in
            every chunk that reads the node) instead of ``nn.Dropout``.

    Shapes:
        ``forward``: ``x`` ``(|V|, F)``, ``edge_index`` ``(2, |E|)`` -> ``(|V|, C)``.
    """

    def __init__(self, in_channels: int, hidden: int, out_channels: int, num_layers: int, alpha: float = 0.1,
                 theta: float = 0.5, dropout: float = 0.5, node_dropout: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            [_Input(in_channels, hidden, dropout, node_dropout)]
            + [GCNIILayer(hidden, alpha, theta, i + 1, dropout, node_dropout) for i in range(num_layers)]
            + [_Output(hidden, out_channels, dropout, node_dropout)]
        )

    def pipeline_blocks(self) -> List[nn.Module]:
        return list(self.blocks)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        x = x0 = self.blocks[0](x, edge_index)
        for block in self.blocks[1:-1]:
            x = block(x, edge_index, x0)
        return self.blocks[-1](x, edge_index)
