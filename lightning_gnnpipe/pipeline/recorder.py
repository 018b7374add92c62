"""Count the pipeline's P2P bytes and split a stage's step time into compute, bubble and wait.

``torch.distributed.pipelining`` (torch 2.13) builds every stage-boundary transfer as a
``dist.P2POp`` in ``get_fwd_send_ops`` / ``get_bwd_send_ops`` (and the matching ``*_recv_ops``)
of the stage, and the schedule runs them. Wrapping those four methods of *this* stage object
counts exactly the tensors that cross the boundary. Wrapping ``forward_one_chunk``,
``backward_one_chunk`` (and ``backward_weight_one_chunk``, the zero-bubble schedules' weight pass) and
the schedule's loss call gives a timeline of compute events; what is
left of the step is time spent blocked on the neighbours. torch offers no callback for either, so the wrapping
relies on how its schedules call their stages: it lives in :func:`~lightning_gnnpipe._compat.wrap_pipeline_calls`.

* bubble (fill and drain): the gap before the first forward, the gap before the first
  backward, and the gap after the last backward until the step ends;
* wait: every other gap (steady-state waiting for a neighbour's activations or gradients).

For equal stage times the bubble is ``(S-1)/(K+S-1)`` of the step (GPipe, arXiv 1811.06965).

On a CUDA device the timeline is read from CUDA events (``torch.cuda.Event(enable_timing=True)``), recorded around
each action and resolved once at the end of the step, so the kernels' time is measured without a host sync per
chunk; on the CPU it is ``time.perf_counter`` (:class:`~lightning_gnnpipe.comm.accounting.StepClock`, shared with
graph parallelism's timings).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.distributed as dist

from lightning_gnnpipe._compat import wrap_pipeline_calls
from lightning_gnnpipe.comm.accounting import CommStats, StepClock, nbytes

__all__ = ["PipelineRecorder", "StepClock"]


class PipelineRecorder:
    """Instrument one rank's ``PipelineStage`` and schedule; fill a :class:`CommStats` per step.

    Args:
        schedule: A single-stage schedule (``ScheduleGPipe``, ``Schedule1F1B``) or a multi-stage one
            (interleaved, looped BFS, zero bubble: every stage; :func:`~lightning_gnnpipe._compat.pipeline_stages`).
        stats: The object to fill; :meth:`begin` resets it.
        device: The stages' device (CUDA: timed with CUDA events).
    """

    def __init__(self, schedule: Any, stats: CommStats, device: Optional[torch.device] = None) -> None:
        self.stats = stats
        self.clock = StepClock(device)
        stats.clock = self.clock  # the hybrid's exchange waits are timed by the same clock
        self.events: List[Tuple[str, float, float]] = []  # (action, start s, end s) from the step's start
        self._marks: List[Tuple[str, Any, Any]] = []
        self._t0: Any = 0.0
        wrap_pipeline_calls(schedule, self._counting, self._timed)

    def _counting(self, method: Callable, kind: str) -> Callable:
        def wrapped(*args: Any, **kwargs: Any):
            ops = method(*args, **kwargs)
            for op in ops:
                if op.op in (dist.isend, dist.send):
                    self.stats.record(kind, sent=nbytes(op.tensor))
                else:
                    self.stats.record(kind, recv=nbytes(op.tensor))
            return ops

        return wrapped

    def _timed(self, method: Callable, name: str) -> Callable:
        def wrapped(*args: Any, **kwargs: Any):
            start = self.clock.mark()
            try:
                return method(*args, **kwargs)
            finally:
                self._marks.append((name, start, self.clock.mark()))

        return wrapped

    def begin(self) -> None:
        """Start a step: reset the counts and the timeline."""
        self.stats.reset()
        self.events, self._marks = [], []
        self._t0 = self.clock.mark()

    def end(self) -> None:
        """End a step: set ``step_s``, ``compute_s``, ``bubble_s`` and ``wait_s`` (seconds)."""
        end = self.clock.mark()
        self.clock.wait()
        self.stats.settle()
        seconds = self.clock.seconds
        self.events = [(name, seconds(self._t0, b), seconds(self._t0, e)) for name, b, e in self._marks]
        t1 = seconds(self._t0, end)
        s = self.stats
        s.step_s = t1
        if not self.events:
            return
        s.compute_s = sum(e - b for _, b, e in self.events)
        bubble = self.events[0][1] + (t1 - self.events[-1][2])
        first_bwd = next((i for i, ev in enumerate(self.events) if ev[0] == "bwd"), None)
        if first_bwd:
            bubble += self.events[first_bwd][1] - self.events[first_bwd - 1][2]
        s.bubble_s = bubble
        s.wait_s = max(0.0, s.step_s - s.compute_s - bubble)
