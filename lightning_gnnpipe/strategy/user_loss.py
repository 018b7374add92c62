"""The user's ``training_step`` as the pipeline's loss: the callables handed down to the runtime each step.

:func:`run_training_step` runs the user's unchanged ``training_step`` on a full-graph output ``(|V|, C)`` (the layer
stack returns it, :func:`~lightning_gnnpipe.strategy.forward_patch.stack_returns`). :class:`UserLoss` turns that
into what :meth:`~lightning_gnnpipe.pipeline.runtime.PipelineRuntime.step` needs for the loss mode of the fit
(:mod:`~lightning_gnnpipe.strategy.schedule_choice`): the full loss (GPipe; silenced and called once per chunk in
the ``"separable"`` mode of 1F1B, :mod:`~lightning_gnnpipe.strategy.quiet_step`) or the module's
``pipeline_chunk_loss`` (``"chunk"`` mode), and it runs the probe that decides between them.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import torch
from lightning.pytorch import LightningModule
from torch import Tensor, nn

from lightning_gnnpipe.pipeline.loss import labelled_chunks
from lightning_gnnpipe.pipeline.separable import probe_row_separable, rows_outside
from lightning_gnnpipe.strategy.forward_patch import stack_returns
from lightning_gnnpipe.strategy.quiet_step import quiet_step

CHUNK_LOSS_HOOK = "pipeline_chunk_loss"
"""Optional LightningModule method ``pipeline_chunk_loss(out, batch, node_index)``: chunk ``c``'s part of the loss."""


def run_training_step(module: LightningModule, stack: nn.Module, full: Tensor, batch: Any, args: tuple,
                      kwargs: dict) -> Tuple[Tensor, Any]:
    """Run ``module.training_step(*args, **kwargs)`` with ``stack(x, edge_index)`` returning ``full`` ``(|V|, C)``.

    Returns:
        ``(loss, output)``: the loss tensor (``output["loss"]`` for a dict) and what the step returned.
    """
    with stack_returns(stack, full, batch):
        output = module.training_step(*args, **kwargs)
    loss = output["loss"] if isinstance(output, dict) else output
    return loss, output


def has_chunk_loss(module: nn.Module) -> bool:
    """Whether the module defines ``pipeline_chunk_loss``."""
    return callable(getattr(module, CHUNK_LOSS_HOOK, None))


class UserLoss:
    """The user's loss for one fit, in the loss mode the schedule needs.

    Args:
        module: The LightningModule.
        stack: Its layer stack module (what ``self(x, edge_index)`` calls).
        chunk_nodes: Global node ids of each chunk (``K`` tensors), for ``pipeline_chunk_loss``.
        loss_mode: ``"deferred"``, ``"separable"`` or ``"chunk"`` (:class:`~lightning_gnnpipe.pipeline.loss.PipelineLoss`);
            may be set after the probe.
    """

    def __init__(self, module: LightningModule, stack: nn.Module, chunk_nodes: List[Tensor],
                 loss_mode: str = "deferred") -> None:
        self.module, self.stack, self.chunk_nodes, self.loss_mode = module, stack, chunk_nodes, loss_mode

    def probe(self, batch: Any, num_classes: int, dtype: torch.dtype, device: torch.device) -> Optional[str]:
        """Whether the ``training_step`` loss is row-separable (:func:`probe_row_separable`): ``None`` or why not."""
        def loss_of(full: Tensor) -> Tensor:
            with quiet_step(self.module):
                return run_training_step(self.module, self.stack, full, batch, (batch, 0), {})[0]

        num_nodes = sum(int(n.numel()) for n in self.chunk_nodes)
        return probe_row_separable(loss_of, num_nodes, num_classes, self.chunk_nodes, dtype=dtype, device=device)

    def check_steps(self, datamodule: Any, to_device: Callable[[Any], Any], num_classes: int, dtype: torch.dtype,
                    device: torch.device) -> None:
        """With several steps an epoch (``datamodule.chunks_per_step < num_chunks``), check on the first step's batch
        that the ``training_step`` loss reads the rows of that step's chunks only (:func:`rows_outside`; every rank
        computes the same answer).

        Raises:
            ValueError: The loss's gradient reaches rows outside the step's chunks (a term over every node, a mask
                other than ``batch.train_mask``): it would train differently from one device.
        """
        if datamodule.steps_per_epoch == 1:
            return
        group = datamodule.step_groups(0)[0]
        batch = to_device(datamodule.train_dataloader().dataset[tuple(group)])
        rows = torch.cat([self.chunk_nodes[c] for c in group])

        def loss_of(full: Tensor) -> Tensor:
            with quiet_step(self.module):
                return run_training_step(self.module, self.stack, full, batch, (batch, 0), {})[0]

        outside = rows_outside(loss_of, sum(int(n.numel()) for n in self.chunk_nodes), num_classes, rows, dtype, device)
        if outside:
            raise ValueError(
                f"GNNPipeStrategy: with chunks_per_step={datamodule.chunks_per_step} < num_chunks="
                f"{datamodule.num_chunks} a step's loss may read only the rows of its chunks (their labelled nodes are "
                f"batch.train_mask), but the `training_step` loss reaches {outside} rows outside the first step's "
                f"chunks {group} (got a loss over other nodes). Compute it over batch.train_mask, or leave "
                "chunks_per_step=None.")

    def for_step(self, batch: Any, args: tuple, kwargs: dict) -> Tuple[Callable, Callable]:
        """The ``(full_loss, chunk_loss)`` callables of one training step (``PipelineRuntime.step``'s arguments)."""
        labelled: List[Optional[List[bool]]] = [None]  # per chunk: has training nodes; read once per step

        def full_loss(full: Tensor) -> Tuple[Tensor, Any]:
            if self.loss_mode != "separable":
                return run_training_step(self.module, self.stack, full, batch, args, kwargs)
            with quiet_step(self.module):  # called once per chunk: it must not log
                return run_training_step(self.module, self.stack, full, batch, args, kwargs)

        def chunk_loss(out: Tensor, c: int) -> Tensor:
            if labelled[0] is None:
                labelled[0] = labelled_chunks(batch, self.chunk_nodes)
            if not labelled[0][c]:
                return out.sum() * 0.0  # the chunk still runs forward and backward, and adds exactly zero
            return getattr(self.module, CHUNK_LOSS_HOOK)(out, batch, self.chunk_nodes[c])

        return full_loss, chunk_loss
