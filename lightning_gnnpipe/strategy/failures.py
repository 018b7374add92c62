"""Tell the user which rank and stage failed, and let the original error win.

When one rank raises, the others are usually waiting for it in a send, receive or collective;
they fail a moment later with a connection error (or, if the failed rank hangs instead of
exiting, with the process-group timeout). Every launcher (spawn, popen, torchrun) reports the
first rank that exits with an error and stops the rest, so:

* the original error gets a note naming its rank, stage and layers;
* a rank that fails only because a peer went away gets a note saying so, and waits
  :data:`PEER_FAILURE_GRACE_S` seconds before exiting, so that the launcher sees the rank with
  the original error exit first;
* an error raised inside a stage's forward pass reaches the user as itself: torch's pipelining
  stage wraps it in ``RuntimeError("[Stage i] failed to run forward: ...")`` (the original only
  as ``__cause__``, mid-traceback); :func:`unwrap_stage_error` finds the original in the ``__cause__`` chain.

Under NCCL a peer that died leaves the others blocked in a transfer on the GPU, which no Python exception ends:
NCCL's watchdog does, after the process group's timeout. :func:`enable_nccl_error_handling` turns on NCCL's
asynchronous error handling before the process group starts (as ``torchrun`` does), so the watchdog aborts the
communicators and tears the process down, with a line naming the rank (``[... Rank r] Watchdog caught collective
operation timeout: WorkNCCL(SeqNum=..., OpType=...) ran for ... milliseconds``); the strategies run their own
exchanges in process groups with a short timeout (``exchange_timeout``), so that happens within it.
"""

from __future__ import annotations

import os
import time
from typing import MutableMapping, Optional

import torch.distributed as dist

from lightning_gnnpipe.pipeline.stage import STAGE_ERROR

PEER_FAILURE_GRACE_S = 2.0
"""Seconds a rank whose peer failed waits before it exits (so the original error is reported)."""

_PEER_MARKERS = (  # gloo and nccl messages when a peer died, hung or closed its connections
    "connection closed by peer",
    "connection reset by peer",
    "remote worker",
    "broken pipe",
    "timed out",
    "timeout",
)
_MARK = "_gnnpipe_handled"

NCCL_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
"""NCCL's asynchronous error handling switch (read when an NCCL process group is created)."""


def enable_nccl_error_handling(backend: Optional[str], environ: Optional[MutableMapping[str, str]] = None) -> bool:
    """Set :data:`NCCL_ERROR_HANDLING` to ``"1"`` for an NCCL backend, unless it is set already; return whether set.

    ``1``: on an NCCL error or a timed-out collective, NCCL's watchdog aborts the communicators and tears the process
    down (PyTorch's ``ProcessGroupNCCL`` environment variables); ``torchrun`` sets the same default for its workers.
    Call it in the rank's own process before its process group is created. Other backends: nothing is set.

    Args:
        backend: The process group backend (``"nccl"``, ``"gloo"``, ``"cpu:gloo,cuda:nccl"``, ...).
        environ: The environment to change (default: ``os.environ``).
    """
    environ = os.environ if environ is None else environ
    if backend is None or "nccl" not in backend.lower() or NCCL_ERROR_HANDLING in environ:
        return False
    environ[NCCL_ERROR_HANDLING] = "1"
    return True


def is_peer_failure(exc: BaseException) -> bool:
    """Return whether ``exc`` looks like the consequence of another rank failing."""
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(m in text for m in _PEER_MARKERS)


def handle_rank_failure(exc: BaseException, where: str) -> None:
    """Add the rank/stage note to ``exc`` (once); pause if a peer's failure caused it.

    Args:
        exc: The exception Lightning passes to ``Strategy.on_exception``.
        where: This rank's place, e.g. ``"rank 3 (stage 1 of 2, partition 1 of 2, layers [2, 3])"``.
    """
    if getattr(exc, _MARK, False) or not isinstance(exc, Exception):
        return
    try:
        setattr(exc, _MARK, True)
    except AttributeError:  # exceptions with __slots__
        pass
    if is_peer_failure(exc):
        exc.add_note(
            f"GNNPipeStrategy: {where} stopped because another rank stopped answering; the error of the rank "
            "that failed first is the cause."
        )
        time.sleep(PEER_FAILURE_GRACE_S)
    else:
        exc.add_note(f"GNNPipeStrategy: this error was raised on {where}.")


def unwrap_stage_error(exc: BaseException) -> BaseException:
    """Return the error a block raised in a pipeline stage's forward pass, if ``exc`` wraps it.

    ``torch.distributed.pipelining`` (``_PipelineStageBase.forward_one_chunk``, torch 2.13) catches any
    exception of the stage module's forward and raises a ``RuntimeError`` from it. The stage module
    (:class:`~lightning_gnnpipe.pipeline.stage.GNNStage`) marks every exception it lets through with its stage
    index (:data:`~lightning_gnnpipe.pipeline.stage.STAGE_ERROR`); the first marked exception in ``exc``'s
    ``__cause__`` chain gets a note naming the stage and is returned. Any other exception is returned unchanged.

    Args:
        exc: an exception raised by ``schedule.step``.

    Returns:
        The original exception, else ``exc``.
    """
    cause = exc.__cause__
    seen = {id(exc)}
    while cause is not None and id(cause) not in seen:
        stage = getattr(cause, STAGE_ERROR, None)
        if stage is not None and isinstance(cause, Exception):
            cause.add_note(f"GNNPipeStrategy: raised in the forward pass of pipeline stage {stage} "
                           "(torch.distributed.pipelining wraps it in a RuntimeError; this is the original).")
            return cause
        seen.add(id(cause))
        cause = cause.__cause__
    return exc
