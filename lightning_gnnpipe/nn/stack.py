"""Find the ordered layer blocks of a user's GNN so that they can be cut into stages.

Two kinds of model are understood:

1. A PyG :class:`~torch_geometric.nn.models.basic_gnn.BasicGNN` (``GCN``, ``GraphSAGE``,
   ``GIN``, ``GAT``, ``PNA``, ...) anywhere inside the LightningModule: layer ``i`` is
   ``convs[i]`` followed, except after the last layer, by the model's norm, activation and
   dropout, exactly as ``BasicGNN.forward`` does it. With ``jk="last"`` every conv layer
   gets norm/activation/dropout and one node-wise block applies the final ``lin``; the other
   jumping-knowledge modes need every layer's output at the head and are refused.
2. Any module (the LightningModule itself or a submodule) with a method
   ``pipeline_blocks() -> Sequence[nn.Module]``: each block is called ``block(x, edge_index)``
   and returns the next ``x``; the module's ``forward(x, edge_index)`` must be exactly the
   blocks applied in order. See ``docs/custom_models.md``.

The user's modules are wrapped, never changed or copied: the blocks share their parameters.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Optional

import torch
from torch import Tensor, nn
from torch_geometric.nn import MessagePassing
from torch_geometric.nn.models.basic_gnn import BasicGNN


@dataclass
class LayerStack:
    """The module whose ``forward(x, edge_index)`` the pipeline replaces, and its blocks.

    Attributes:
        module: The user's module that computes ``blocks[L-1](...blocks[0](x, edge_index)...)``.
        blocks: The ``L`` layer blocks in order; each maps ``(x, edge_index)`` to the next ``x``.
    """

    module: nn.Module
    blocks: List[nn.Module]

    @property
    def num_layers(self) -> int:
        return len(self.blocks)


class BasicGNNLayer(nn.Module):
    """Layer ``index`` of a PyG ``BasicGNN``: conv, then norm/activation/dropout if not last.

    Shares the parameters of ``gnn`` (no copy). Mirrors ``BasicGNN.forward`` in
    torch_geometric 2.8 for ``jk=None`` and ``jk="last"``.
    """

    def __init__(self, gnn: BasicGNN, index: int) -> None:
        super().__init__()
        self.conv = gnn.convs[index]
        self.is_last = index == gnn.num_layers - 1 and gnn.jk_mode is None
        if not self.is_last:
            self.norm = gnn.norms[index] if gnn.norms is not None else nn.Identity()
            self.act = gnn.act
            self.dropout = gnn.dropout
            self.act_first = gnn.act_first

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        x = self.conv(x, edge_index)
        if self.is_last:
            return x
        if self.act is not None and self.act_first:
            x = self.act(x)
        x = self.norm(x)
        if self.act is not None and not self.act_first:
            x = self.act(x)
        return self.dropout(x)


class NodeWise(nn.Module):
    """Call a node-wise module (``module(x)``) with the block signature ``(x, edge_index)``."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.module(x)


def _blocks_of_basic_gnn(gnn: BasicGNN) -> List[nn.Module]:
    if gnn.jk_mode not in (None, "last"):
        raise ValueError(
            f"find_layer_stack: {type(gnn).__name__}(jk={gnn.jk_mode!r}) combines every layer's output "
            "at the head, which a pipeline does not carry between stages (got jk="
            f"{gnn.jk_mode!r}). Use jk=None or jk='last'."
        )
    blocks: List[nn.Module] = [BasicGNNLayer(gnn, i) for i in range(gnn.num_layers)]
    if gnn.jk_mode == "last":
        blocks.append(NodeWise(gnn.lin))
    return blocks


def find_layer_stack(module: nn.Module) -> LayerStack:
    """Locate the layer stack in a LightningModule.

    Args:
        module: The user's LightningModule.

    Returns:
        The :class:`LayerStack`.

    Raises:
        TypeError: If no stack is found.
        ValueError: If several stacks are found, a block list is empty, or a ``BasicGNN`` uses
            ``jk='cat'``, ``'max'`` or ``'lstm'``.
    """
    declared = [m for m in module.modules() if callable(getattr(m, "pipeline_blocks", None))]
    if len(declared) > 1:
        names = [type(m).__name__ for m in declared]
        raise ValueError(f"find_layer_stack: several modules define `pipeline_blocks` (got {names}). Keep one.")
    if declared:
        blocks = list(declared[0].pipeline_blocks())
        if not blocks or not all(isinstance(b, nn.Module) for b in blocks):
            raise ValueError(
                f"find_layer_stack: {type(declared[0]).__name__}.pipeline_blocks() must return a non-empty "
                f"sequence of nn.Module (got {[type(b).__name__ for b in blocks]})."
            )
        return LayerStack(declared[0], blocks)
    gnns = [m for m in module.modules() if isinstance(m, BasicGNN)]
    if len(gnns) > 1:
        raise ValueError(
            f"find_layer_stack: found {len(gnns)} BasicGNN models; the pipeline needs one layer stack. "
            "Define `pipeline_blocks()` on the module that composes them."
        )
    if not gnns:
        raise TypeError(
            f"find_layer_stack: {type(module).__name__} holds no PyG BasicGNN (GCN, GraphSAGE, GIN, GAT, ...) "
            "and no module defines `pipeline_blocks()`, so its layers cannot be split into stages. "
            "See docs/custom_models.md."
        )
    return LayerStack(gnns[0], _blocks_of_basic_gnn(gnns[0]))


class BlockStack(nn.Module):
    """A model made of layer blocks applied in order, declared to the pipeline.

    Subclass it (or use it directly) to get both halves of the ``pipeline_blocks()`` protocol:
    ``forward(x, edge_index)`` applies ``blocks`` in order, and ``pipeline_blocks()`` returns them.

    Args:
        blocks: Modules called ``block(x, edge_index)``, in order.

    Shapes:
        ``forward``: ``x`` ``(|V|, F)``, ``edge_index`` ``(2, |E|)`` -> ``(|V|, C)``.
    """

    def __init__(self, blocks: List[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def pipeline_blocks(self) -> nn.ModuleList:
        return self.blocks

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        for block in self.blocks:
            x = block(x, edge_index)
        return x


def takes_x0(block: nn.Module) -> bool:
    """Return whether a block is called ``block(x, edge_index, x0)`` with the initial embedding.

    A block opts in with the attribute ``takes_x0 = True`` (GCNII-style models, whose layers mix in
    the output of block 0; see ``docs/custom_models.md``).
    """
    return bool(getattr(block, "takes_x0", False))


def call_block(block: nn.Module, x: Tensor, edge_index: Tensor, x0: Optional[Tensor]) -> Tensor:
    """Call a block with ``x0`` if it takes one."""
    return block(x, edge_index, x0) if takes_x0(block) else block(x, edge_index)


def uses_graph(block: nn.Module) -> bool:
    """Return whether a block passes messages (needs halo rows) or is node-wise only."""
    return any(isinstance(m, MessagePassing) for m in block.modules())


@contextmanager
def eval_mode(modules: Iterable[nn.Module]) -> Iterator[None]:
    """Put ``modules`` (and every submodule) in eval mode for the block; restore each one's own training flag after
    it, even where the flags differed between submodules."""
    modules = list(modules)
    flags = [(m, m.training) for module in modules for m in module.modules()]
    try:
        for module in modules:
            module.eval()
        yield
    finally:
        for m, flag in flags:
            m.training = flag


@torch.no_grad()
def infer_dims(blocks: List[nn.Module], x_example: Tensor) -> List[int]:
    """Return the feature width entering each block and leaving the last, ``L + 1`` ints.

    Runs every block once, in eval mode, on a 2-node graph with one edge built from
    ``x_example`` ``(2, F)``; training flags are restored afterwards.
    """
    edge_index = torch.tensor([[0, 1], [1, 0]], device=x_example.device)
    dims = [x_example.size(-1)]
    with eval_mode(blocks):
        x, x0 = x_example, None
        for i, b in enumerate(blocks):
            x = call_block(b, x, edge_index, x0)
            x0 = x if i == 0 else x0
            dims.append(x.size(-1))
    return dims
