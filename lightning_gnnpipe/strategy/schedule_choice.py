"""Which schedule and loss mode a fit runs: ``schedule="auto"`` and the loss each schedule needs.

GPipe runs every chunk's forward before any backward, so it keeps all ``K`` chunks' activations until the
backward; 1F1B starts backwards after ``S`` forwards and keeps at most about ``S`` chunks' (arXiv 2104.04473,
Sec. 2.2). Both take the same optimizer step (one per epoch, gradients summed over the chunks). Measured
(docs/results/scale.md, 1M nodes, GCN-8, 2 processes, K = 8) 1F1B is both faster and smaller, so ``"auto"`` picks it
whenever it can drive the user's loss:

* the module defines ``pipeline_chunk_loss`` (loss mode ``"chunk"``), or
* the ``training_step`` loss is row-separable (:func:`~lightning_gnnpipe.pipeline.separable.probe_row_separable`;
  loss mode ``"separable"``),

and ``K / G >= S`` (torch's ``Schedule1F1B`` needs at least as many micro-batches as stages). Otherwise ``"auto"`` runs
GPipe (loss mode ``"deferred"``, exact for any loss) and says why in one line. A named schedule other than GPipe
with a loss that can drive none of these raises.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

from lightning_gnnpipe.pipeline.schedule import AUTO


class ScheduleChoice(NamedTuple):
    """The schedule a fit runs and how the last stage computes each chunk's output gradient.

    Attributes:
        schedule: A key of :data:`~lightning_gnnpipe.pipeline.schedule.SCHEDULES`.
        loss_mode: ``"deferred"``, ``"separable"`` or ``"chunk"`` (:class:`~lightning_gnnpipe.pipeline.loss.PipelineLoss`).
        reason: Why ``"auto"`` did not pick 1F1B (``None`` when it did, or when a schedule was named).
    """

    schedule: str
    loss_mode: str
    reason: Optional[str] = None


def choose_schedule(requested: str, chunks_per_pipeline: int, num_stages: int, has_chunk_loss: bool,
                    probe: Callable[[], Optional[str]]) -> ScheduleChoice:
    """Resolve the requested schedule and its loss mode.

    Args:
        requested: The strategy's ``schedule`` (``"auto"`` or a key of ``SCHEDULES``).
        chunks_per_pipeline: ``K / G`` micro-batches per step.
        num_stages: ``S``, ranks per pipeline.
        has_chunk_loss: Whether the module defines ``pipeline_chunk_loss``.
        probe: Runs the row-separability probe; returns ``None`` or why the loss is not separable. Called at most
            once, and only when the answer matters.

    Returns:
        The :class:`ScheduleChoice`.

    Raises:
        ValueError: A named schedule other than ``"gpipe"`` with neither ``pipeline_chunk_loss`` nor a separable loss.
    """
    if requested == "gpipe":
        return ScheduleChoice("gpipe", "deferred")
    if requested == AUTO and chunks_per_pipeline < num_stages:
        return ScheduleChoice("gpipe", "deferred", f"1F1B needs at least as many chunks per pipeline as stages "
                                                   f"(got {chunks_per_pipeline} < {num_stages})")
    target = "1f1b" if requested == AUTO else requested
    if has_chunk_loss:
        return ScheduleChoice(target, "chunk")
    why = probe()
    if why is None:
        return ScheduleChoice(target, "separable")
    if requested == AUTO:
        return ScheduleChoice("gpipe", "deferred", why)
    raise ValueError(
        f"GNNPipeStrategy: schedule {requested!r} runs backwards before all chunks have run forward, so it needs "
        f"each chunk's loss gradient from that chunk's rows alone, but {why}. Define "
        "`pipeline_chunk_loss(self, out, batch, node_index)` (see docs/quickstart.md), or use schedule='gpipe' or "
        "'auto'."
    )


def probe_on_one_rank(probe: Callable[[], Optional[str]], source: int, rank: int,
                      broadcast: Callable[..., Any]) -> Callable[[], Optional[str]]:
    """Make ``probe`` a collective: rank ``source`` runs it, every rank gets its answer (or its error).

    Args:
        probe: The row-separability probe (needs the last stage's view of the loss: run it on one rank).
        source: Global rank that runs it.
        rank: This rank.
        broadcast: ``broadcast(obj, src=...)`` over every rank (the strategy's).

    Raises:
        RuntimeError: On every rank, when the probe raised on ``source`` (its message included).
    """

    def agreed() -> Optional[str]:
        answer: Any = None
        if rank == source:
            try:
                answer = probe()
            except Exception as exc:  # every rank raises it, instead of waiting on this one
                answer = ("error", f"{type(exc).__name__}: {exc}")
        answer = broadcast(answer, src=source)
        if isinstance(answer, tuple):
            raise RuntimeError(f"GNNPipeStrategy: probing the `training_step` loss at setup failed on rank {source}: "
                               f"{answer[1]}")
        return answer

    return agreed
