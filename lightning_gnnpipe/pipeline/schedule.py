"""Build the ``torch.distributed.pipelining`` stage and schedule for one rank.

Source: PyTorch docs, "Pipeline Parallelism" (``torch.distributed.pipelining``), torch 2.13.
Shapes are given up front (STATIC mode), so no shape-inference forward runs: that forward
would feed uninitialised buffers to the stateful stage and write them into its tables.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining.schedules import PipelineScheduleSingle

SCHEDULES: Dict[str, type] = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
"""Schedule names accepted by :class:`~lightning_gnnpipe.GNNPipeStrategy`."""


def check_schedule(name: object, num_chunks: Optional[int] = None, num_stages: Optional[int] = None) -> str:
    """Validate a schedule name and, when given, its chunk/stage counts.

    Raises:
        ValueError: Unknown name, or ``1f1b`` with fewer chunks than stages.
    """
    if name not in SCHEDULES:
        raise ValueError(
            f"GNNPipeStrategy: unknown `schedule` {name!r}. Valid schedules: {sorted(SCHEDULES)}."
        )
    if name == "1f1b" and num_chunks is not None and num_stages is not None and num_chunks < num_stages:
        raise ValueError(
            f"GNNPipeStrategy: `num_chunks` ({num_chunks}) must be at least `num_stages` ({num_stages}) "
            "for schedule '1f1b'. Use more chunks or 'gpipe'."
        )
    return str(name)


def build_schedule(
    module: nn.Module,
    stage_index: int,
    num_stages: int,
    device: torch.device,
    rows: int,
    in_channels: Sequence[int],
    out_channels: Sequence[int],
    schedule: str,
    num_chunks: int,
    loss_fn: Optional[Callable],
    group=None,
    in_dtype: torch.dtype = torch.float32,
    out_dtype: torch.dtype = torch.float32,
) -> PipelineScheduleSingle:
    """Wrap ``module`` in a :class:`PipelineStage` with static shapes and build its schedule.

    Args:
        module: The stage module (``forward(h, chunk_id)``).
        stage_index: This rank's stage ``s``.
        num_stages: ``S``.
        device: Where the stage runs.
        rows: ``M``, padded rows per micro-batch.
        in_channels: Width of each tensor entering the stage.
        out_channels: Width of each tensor leaving the stage.
        schedule: A key of :data:`SCHEDULES`.
        num_chunks: ``K`` micro-batches per step.
        loss_fn: The last stage's loss (``None`` elsewhere).
        group: Process group of the pipeline (default: world).
        in_dtype: Dtype of the tensors entering the stage (P2P receive buffers).
        out_dtype: Dtype of the tensors leaving the stage (the module must return this dtype).
    """
    stage = PipelineStage(
        module,
        stage_index,
        num_stages,
        device,
        input_args=tuple(torch.empty(rows, d, device=device, dtype=in_dtype, requires_grad=stage_index > 0)
                         for d in in_channels),
        output_args=tuple(torch.empty(rows, d, device=device, dtype=out_dtype, requires_grad=True)
                          for d in out_channels),
        group=group,
    )
    return SCHEDULES[schedule](stage, n_microbatches=num_chunks, loss_fn=loss_fn, scale_grads=False)
