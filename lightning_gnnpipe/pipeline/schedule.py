"""Build the ``torch.distributed.pipelining`` stages and schedule for one rank.

Source: PyTorch docs, "Pipeline Parallelism" (``torch.distributed.pipelining``), torch 2.13.
Shapes are given up front (STATIC mode), so no shape-inference forward runs: that forward
would feed uninitialised buffers to the stateful stage and write them into its tables.

Single-stage schedules (``"gpipe"``, ``"1f1b"``) put one stage on each of the ``S`` ranks.
Multi-stage schedules cut the layers into ``S * v`` *virtual* stages, ``v`` per rank
(``stages_per_rank``): loop placement (virtual stage ``i`` on rank ``i % S``; interleaved 1F1B,
arXiv 2104.04473; looped BFS, arXiv 2211.05953; interleaved zero bubble, arXiv 2401.10241) or the
V shape of ZB-V (rank ``r`` holds ``r`` and ``2S - 1 - r``, arXiv 2401.10241 Sec. 6).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import get_schedule_class

SINGLE_STAGE_SCHEDULES: Dict[str, type] = {"gpipe": get_schedule_class("GPipe"), "1f1b": get_schedule_class("1F1B")}
"""One stage per rank (``stages_per_rank=1``)."""

MULTI_STAGE_SCHEDULES: Dict[str, type] = {
    "interleaved_1f1b": get_schedule_class("Interleaved1F1B"),
    "looped_bfs": get_schedule_class("LoopedBFS"),
    "interleaved_zb": get_schedule_class("InterleavedZeroBubble"),
    "zbv": get_schedule_class("ZBVZeroBubble"),
}
"""Several (virtual) stages per rank (``stages_per_rank >= 2``; ``"zbv"``: exactly 2)."""

SCHEDULES: Dict[str, type] = {**SINGLE_STAGE_SCHEDULES, **MULTI_STAGE_SCHEDULES}
"""Schedule names accepted by :class:`~lightning_gnnpipe.GNNPipeStrategy`."""

NEEDS_TORCH: Dict[str, Tuple[int, int]] = {"zbv": (2, 13)}
"""Schedules that need a newer torch than the oldest one supported (2.11): on torch 2.11 ZB-V's stages fail to connect
over gloo while the schedule initialises them (``RuntimeError: ... Pair is not connected``)."""

AUTO = "auto"
"""The default schedule name: ``"1f1b"`` where the loss and ``K >= S`` allow it, else ``"gpipe"``
(:func:`~lightning_gnnpipe.strategy.schedule_choice.choose_schedule`)."""

_ROUNDS_RULE = ("interleaved_1f1b", "interleaved_zb")


def torch_release(version: str = torch.__version__) -> Tuple[int, int]:
    """``(major, minor)`` of a torch version string such as ``"2.11.0+cu130"``."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def unavailable(schedule: str, version: Optional[str] = None) -> Optional[str]:
    """Why ``schedule`` cannot run on torch ``version`` (default: the installed one; :data:`NEEDS_TORCH`), or ``None``
    where it can."""
    version = version or torch.__version__
    need = NEEDS_TORCH.get(schedule)
    if need is None or torch_release(version) >= need:
        return None
    return (f"schedule {schedule!r} needs torch >= {need[0]}.{need[1]} (got torch {version}): on older torch its "
            "stages fail to connect while the schedule initialises them")


def check_torch_for(schedule: str, version: Optional[str] = None) -> None:
    """Refuse a schedule torch ``version`` (default: the installed one) cannot run (:func:`unavailable`), before any
    process group starts.

    Raises:
        ValueError: Naming the schedule, the torch version found and the version it needs.
    """
    why = unavailable(schedule, version)
    if why is not None:
        raise ValueError(f"GNNPipeStrategy: {why}. Use schedule 'interleaved_zb' or 'interleaved_1f1b' with "
                         "stages_per_rank=2, or a newer torch.")


def is_multi_stage(schedule: str) -> bool:
    """Return whether ``schedule`` runs several stages per rank."""
    return schedule in MULTI_STAGE_SCHEDULES


def check_schedule(name: object, num_chunks: Optional[int] = None, num_stages: Optional[int] = None,
                   stages_per_rank: int = 1) -> str:
    """Validate a schedule name, its ``stages_per_rank`` and, when given, its chunk/stage counts.

    The chunk rules are torch's own (2.13): ``Schedule1F1B`` needs ``K >= S``; interleaved 1F1B and
    interleaved zero bubble split the ``K`` micro-batches into ``max(1, K // S)`` rounds and need ``K``
    to be a multiple of that (so any multiple of ``S`` works, and so does any ``K <= S``); GPipe,
    looped BFS and ZB-V take any ``K >= 1``.

    Args:
        name: The schedule name.
        num_chunks: ``K`` micro-batches per step (per pipeline under hybrid parallelism).
        num_stages: ``S``, ranks per pipeline.
        stages_per_rank: ``v``, virtual stages per rank.

    ``"auto"`` (:data:`AUTO`) takes ``v = 1`` and any ``K``: it becomes ``"gpipe"`` when ``K < S``.

    Raises:
        ValueError: Unknown name; ``v != 1`` with a single-stage schedule or ``"auto"``, ``v < 2`` with a
            multi-stage one, ``v != 2`` with ``"zbv"``; ``K`` not valid for the schedule.
    """
    if name not in SCHEDULES and name != AUTO:
        raise ValueError(
            f"GNNPipeStrategy: unknown `schedule` {name!r}. Valid schedules: {[AUTO] + sorted(SCHEDULES)}."
        )
    v = stages_per_rank
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"GNNPipeStrategy: `stages_per_rank` must be an int >= 1 (got {v!r}).")
    if name == AUTO and v != 1:
        raise ValueError(
            f"GNNPipeStrategy: schedule 'auto' chooses between 'gpipe' and '1f1b', one stage per rank, so "
            f"`stages_per_rank` must be 1 (got stages_per_rank={v}). Name a multi-stage schedule "
            f"{sorted(MULTI_STAGE_SCHEDULES)} for several stages per rank."
        )
    if name in SINGLE_STAGE_SCHEDULES and v != 1:
        raise ValueError(
            f"GNNPipeStrategy: schedule {name!r} runs one stage per rank, so `stages_per_rank` must be 1 "
            f"(got stages_per_rank={v}). Use stages_per_rank=1, or a multi-stage schedule "
            f"{sorted(MULTI_STAGE_SCHEDULES)}."
        )
    if name == "zbv" and v != 2:
        raise ValueError(
            f"GNNPipeStrategy: schedule 'zbv' places exactly 2 stages on each rank (a V shape), so "
            f"`stages_per_rank` must be 2 (got stages_per_rank={v}). Use stages_per_rank=2."
        )
    if name in MULTI_STAGE_SCHEDULES and v < 2:
        raise ValueError(
            f"GNNPipeStrategy: schedule {name!r} runs several stages per rank, so `stages_per_rank` must be "
            f"at least 2 (got stages_per_rank={v}). Use stages_per_rank=2 or more, or schedule 'gpipe'/'1f1b'."
        )
    if num_chunks is None or num_stages is None:
        return str(name)
    if name == "1f1b" and num_chunks < num_stages:
        raise ValueError(
            f"GNNPipeStrategy: `num_chunks` ({num_chunks}) must be at least `num_stages` ({num_stages}) "
            "for schedule '1f1b'. Use more chunks or 'gpipe'."
        )
    rounds = max(1, num_chunks // num_stages)
    if name in _ROUNDS_RULE and num_chunks % rounds:
        raise ValueError(
            f"GNNPipeStrategy: schedule {name!r} runs the `num_chunks` micro-batches in max(1, K // S) = {rounds} "
            f"rounds, so K must be a multiple of {rounds} (got num_chunks={num_chunks}, num_stages={num_stages}). "
            f"Use a multiple of the number of stages, e.g. num_chunks={rounds * num_stages}."
        )
    return str(name)


def stage_ranks(schedule: str, num_stages: int, stages_per_rank: int = 1) -> List[int]:
    """Return the rank (position in the pipeline) of every virtual stage.

    Args:
        schedule: A key of :data:`SCHEDULES`.
        num_stages: ``S``, ranks per pipeline.
        stages_per_rank: ``v``.

    Returns:
        ``S * v`` ranks: ``i % S`` (loop placement), or for ``"zbv"`` ``i`` for ``i < S`` and
        ``2S - 1 - i`` after (V shape, so the last stage is on rank 0).
    """
    total = num_stages * stages_per_rank
    if schedule == "zbv":
        return [i if i < num_stages else total - 1 - i for i in range(total)]
    return [i % num_stages for i in range(total)]


def build_schedule(
    modules: Sequence[nn.Module],
    stage_indices: Sequence[int],
    num_stages: int,
    device: torch.device,
    rows: int,
    in_channels: Sequence[Sequence[int]],
    out_channels: Sequence[Sequence[int]],
    schedule: str,
    num_chunks: int,
    loss_fn: Optional[Callable],
    group=None,
    in_dtypes: Optional[Sequence[torch.dtype]] = None,
    out_dtypes: Optional[Sequence[torch.dtype]] = None,
):
    """Wrap each local stage module in a :class:`PipelineStage` with static shapes; build the schedule.

    Args:
        modules: This rank's stage modules (``forward(h, chunk_id)``), in virtual-stage order.
        stage_indices: Their (virtual) stage indices.
        num_stages: All (virtual) stages of the pipeline, ``S * v``.
        device: Where the stages run.
        rows: ``M``, padded rows per micro-batch (the first stage's input is one placeholder row per micro-batch:
            it reads its chunks' features itself).
        in_channels: Per local stage, the width of each tensor entering it.
        out_channels: Per local stage, the width of each tensor leaving it.
        schedule: A key of :data:`SCHEDULES`.
        num_chunks: ``K`` micro-batches per step.
        loss_fn: The loss (every rank passes one: the schedules run backwards only when it is set).
        group: Process group of the pipeline (default: world).
        in_dtypes: Per local stage, the dtype of the tensors entering it (default float32).
        out_dtypes: Per local stage, the dtype leaving it (the module must return this dtype).

    Returns:
        A single-stage schedule or a multi-stage one (torch's ``ScheduleGPipe``, ``Schedule1F1B``, ...).
    """
    stages = []
    for j, (module, index) in enumerate(zip(modules, stage_indices)):
        in_dtype = in_dtypes[j] if in_dtypes is not None else torch.float32
        out_dtype = out_dtypes[j] if out_dtypes is not None else torch.float32
        stages.append(PipelineStage(
            module,
            index,
            num_stages,
            device,
            input_args=tuple(torch.empty(rows if index > 0 else 1, d, device=device, dtype=in_dtype,
                                         requires_grad=index > 0)
                             for d in in_channels[j]),
            output_args=tuple(torch.empty(rows, d, device=device, dtype=out_dtype, requires_grad=True)
                              for d in out_channels[j]),
            group=group,
        ))
    cls = SCHEDULES[schedule]
    if schedule in SINGLE_STAGE_SCHEDULES:
        return cls(stages[0], n_microbatches=num_chunks, loss_fn=loss_fn, scale_grads=False)
    return cls(stages, n_microbatches=num_chunks, loss_fn=loss_fn, scale_grads=False)
