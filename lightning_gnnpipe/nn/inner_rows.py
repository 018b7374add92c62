"""Which layer blocks can compute their inner rows alone, and the forwards that let them.

A chunk's block gets the chunk's local rows ``[inner; halo]`` ``(n_local, d)``, and its caller keeps the first
``n_inner`` rows of the output. When the block's code is known and every module in it acts on each row alone, the
sparse path (:func:`~lightning_gnnpipe.nn.sparse.sparse_aggregation`) computes only the inner rows (a *rectangular*
output): the dense work after the aggregation is skipped for the halo rows, which in a METIS chunk are often about as
many as the inner ones. Blocks of known code:

* :class:`~lightning_gnnpipe.nn.stack.BasicGNNLayer`: conv, then norm, activation, dropout (a PyG ``BasicGNN``
  layer);
* :class:`~lightning_gnnpipe.nn.gcnii.GCNIILayer`: dropout, ``GCN2Conv``, ReLU; not while a training
  :class:`~lightning_gnnpipe.nn.NodeDropout` of ``p > 0`` acts on its input's local rows (a rectangular call
  declares the inner rows' ids only);
* PyG's ``DeepGCNLayer`` (Li et al., arXiv 2006.07739; the code of torch_geometric 2.8), every ``block`` kind; not
  with ``ckpt_grad`` while training (its checkpoint reruns the conv in the backward pass, after the sparse forward is
  restored), nor with a training ``NodeDropout`` in the ``norm`` or ``act`` of a ``"res+"`` block (they act on the
  input's local rows). Its forward is swapped for the same code with the residual reading the inner rows of its input
  (:func:`inner_row_forwards`); like ``nn.Dropout`` in a ``BasicGNNLayer``, its dropout after the conv
  (``"res"``, ``"dense"``, ``"plain"``) then draws its mask for ``n_inner`` rows, not ``n_local``.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import MLP, BatchNorm, DeepGCNLayer, LayerNorm, MessagePassing
from torch_geometric.nn import Linear as PygLinear

from lightning_gnnpipe.nn.dropout import NodeDropout
from lightning_gnnpipe.nn.gcnii import GCNIILayer
from lightning_gnnpipe.nn.stack import BasicGNNLayer

__all__ = ["conv_input", "inner_row_forwards", "known_row_wise"]

ROW_WISE = (
    nn.Identity, nn.Linear, PygLinear, nn.Dropout, nn.AlphaDropout, NodeDropout, nn.LayerNorm,
    nn.Sequential, nn.ModuleList, nn.ModuleDict, MLP, BatchNorm,  # containers: their children are checked
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.RReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish,
    nn.Softplus, nn.Softsign, nn.Tanh, nn.Tanhshrink, nn.Sigmoid, nn.LogSigmoid, nn.Hardswish, nn.Hardsigmoid,
    nn.Hardtanh,
) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())
"""Modules that act on each row alone in every mode (containers: each child is checked too)."""


def _row_wise(m: nn.Module, known: Tuple[type, ...]) -> bool:
    if isinstance(m, (BasicGNNLayer, GCNIILayer, DeepGCNLayer) + known):
        return True  # their own code is known; their submodules are checked one by one
    if isinstance(m, LayerNorm):
        return m.mode == "node"
    if isinstance(m, nn.BatchNorm1d):
        return not m.training and m.track_running_stats and m.running_mean is not None
    if isinstance(m, (nn.Softmax, nn.LogSoftmax)):
        return m.dim in (None, 1, -1)
    return isinstance(m, ROW_WISE)


def _known_block(block: nn.Module) -> bool:
    if isinstance(block, BasicGNNLayer):
        return True
    if type(block) is GCNIILayer:
        return not _training_node_dropout(block.drop)
    if type(block) is DeepGCNLayer:
        before_conv = [m for part in (block.norm, block.act) if part is not None for m in part.modules()]
        return block.conv is not None and not (block.ckpt_grad and block.training) and not (
            block.block == "res+" and any(_training_node_dropout(m) for m in before_conv))
    return False


def _training_node_dropout(m: nn.Module) -> bool:
    return isinstance(m, NodeDropout) and m.training and m.p > 0


def known_row_wise(block: nn.Module, convs: Tuple[type, ...]) -> bool:
    """Return whether ``block`` can compute only a chunk's inner rows.

    Args:
        block: A layer block.
        convs: The conv types whose forward has an inner-rows form (the sparse path's,
            :data:`~lightning_gnnpipe.nn.sparse.SPARSE_CONVS`).

    Returns:
        ``True`` iff ``block`` is of known code (module docstring; with its exceptions) and every module in it acts on
        each row alone in its current mode (``BatchNorm`` only in evaluation mode with running statistics; PyG
        ``LayerNorm`` only with ``mode="node"``). The answer can change with ``block.train()``/``eval()``. Raises
        nothing: any other block gives ``False``.
    """
    if not _known_block(block):
        return False
    unused = {id(m) for conv in block.modules() if isinstance(conv, MessagePassing)
              for m in conv.aggr_module.modules()}  # the sparse forwards do not call the aggregation module
    return all(_row_wise(m, convs) for m in block.modules() if id(m) not in unused)


def inner_row_forwards(block: nn.Module, residual: Optional[Tensor] = None) -> List[Tuple[nn.Module, Callable]]:
    """The forwards to swap in (:func:`~lightning_gnnpipe.nn.forward_swap.swapped_forward`) while a
    :func:`known_row_wise` ``block``'s convs return ``n_inner`` rows of its ``(n_local, d)`` input.

    Args:
        block: The block.
        residual: For a ``"res+"`` ``DeepGCNLayer`` whose input is already :func:`conv_input`'s output: the inner
            rows of the block's own input ``(n_inner, d)``, which the residual adds; the block then runs its conv
            alone.

    Returns:
        ``[(block, forward)]`` for a ``DeepGCNLayer``, whose residual then adds the inner rows of its input
        (``x[:n_inner]``, PyG 2.8's ``DeepGCNLayer.forward`` otherwise) or ``residual``; ``[]`` for every other
        block, whose own forward already returns its convs' rows.
    """
    return [(block, _deep_gcn_forward(block, residual))] if type(block) is DeepGCNLayer else []


def conv_input(block: nn.Module) -> Optional[Callable[[Tensor], Tensor]]:
    """What a ``"res+"`` ``DeepGCNLayer`` computes from its input before its conv, row by row: ``act(norm(x))``.

    Returns that function ``(n, d) -> (n, d)`` for a ``"res+"`` block whose dropout is off (evaluation mode or
    ``p = 0``), else ``None``; it acts on each row alone where the block is :func:`known_row_wise` (the caller's
    check). An exact whole-graph forward then computes it once for every row of a layer, where a chunk's call
    computes it for the chunk's halo rows too (:meth:`~lightning_gnnpipe.nn.chunk_runner.ChunkRunner.run_full`).
    Raises nothing. Source: PyG 2.8's ``DeepGCNLayer.forward`` (Li et al., arXiv 2006.07739), its ``"res+"`` branch
    before the conv; dropout is left out because it is off.
    """
    if type(block) is not DeepGCNLayer or block.block != "res+" or (block.training and block.dropout > 0):
        return None
    parts = [m for m in (block.norm, block.act) if m is not None]

    def before_conv(x: Tensor) -> Tensor:
        for m in parts:
            x = m(x)
        return x
    return before_conv


def _deep_gcn_forward(layer: DeepGCNLayer, residual: Optional[Tensor] = None) -> Callable:
    def forward(x: Tensor, *args, **kwargs) -> Tensor:  # DeepGCNLayer.forward (torch_geometric 2.8), x cut to h's rows
        if residual is not None:  # "res+", x = conv_input(block input): the conv alone, plus the block input's rows
            return residual + layer.conv(x, *args, **kwargs)
        if layer.block == "res+":
            h = x
            if layer.norm is not None:
                h = layer.norm(h)
            if layer.act is not None:
                h = layer.act(h)
            h = F.dropout(h, p=layer.dropout, training=layer.training)
            h = layer.conv(h, *args, **kwargs)
            return x[: h.size(0)] + h
        h = layer.conv(x, *args, **kwargs)
        if layer.norm is not None:
            h = layer.norm(h)
        if layer.act is not None:
            h = layer.act(h)
        if layer.block == "res":
            h = x[: h.size(0)] + h
        elif layer.block == "dense":
            h = torch.cat([x[: h.size(0)], h], dim=-1)
        return F.dropout(h, p=layer.dropout, training=layer.training)
    return forward
