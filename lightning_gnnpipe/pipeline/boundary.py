"""Stage boundaries under mixed precision: what crosses a boundary travels in the autocast dtype.

The pipeline's P2P buffers are allocated once, before any step, so the dtype crossing a boundary is fixed up
front: activations and their gradients between stages travel in the autocast dtype (bfloat16 under
``precision="bf16-mixed"``), the last stage's output in the data dtype. See
:mod:`~lightning_gnnpipe.strategy.precision` for the reasoning.
"""

from __future__ import annotations

from typing import Tuple, Union

import torch
from torch import Tensor, nn


def cast_all(tensors: Union[Tensor, Tuple[Tensor, ...]], dtype: torch.dtype):
    """Cast a tensor or a tuple of tensors to ``dtype`` (differentiable; no copy if already there)."""
    if isinstance(tensors, tuple):
        return tuple(t.to(dtype) for t in tensors)
    return tensors.to(dtype)


class BoundaryCast(nn.Module):
    """Run a stage with its inputs in the compute dtype and its outputs in the boundary dtype.

    Given to ``PipelineStage`` in place of the stage module when a boundary dtype differs from the
    data dtype (``bf16-mixed``). The stage module is held, not copied; ``chunk_id`` passes through.

    Args:
        stage: The :class:`~lightning_gnnpipe.pipeline.stage.GNNStage`.
        compute_dtype: Dtype the stage's layers receive (the node features' dtype).
        out_dtype: Dtype of what the stage returns (the boundary dtype, or the data dtype on the
            last stage).
    """

    def __init__(self, stage: nn.Module, compute_dtype: torch.dtype, out_dtype: torch.dtype) -> None:
        super().__init__()
        self.stage, self.compute_dtype, self.out_dtype = stage, compute_dtype, out_dtype

    def forward(self, *inputs: Tensor, chunk_id: Tensor):
        inputs = tuple(t.to(self.compute_dtype) for t in inputs)
        return cast_all(self.stage(*inputs, chunk_id=chunk_id), self.out_dtype)
