"""Bytes and seconds spent on communication, per training step, by kind of traffic.

GNNPipe's claim (arXiv 2308.10087, Sec. 3 and 6) is that a pipeline over layers moves far fewer
bytes than graph parallelism on deep models. To check it, both strategies count every tensor
they hand to ``torch.distributed``, from the tensor itself (``numel * element_size``), under
one of :data:`KINDS`:

* ``stage_activations`` / ``stage_gradients``: pipeline P2P between consecutive stages;
* ``halo_embeddings`` / ``halo_gradients``: graph-parallel halo rows, forward / backward;
* ``weight_allreduce``: graph-parallel gradient all-reduce;
* ``logits``: the full-graph output sent to every rank so the user's ``training_step`` runs.

Point-to-point and all-to-all traffic is counted exactly (bytes leaving / reaching this rank).
Collectives are counted as the bytes the textbook algorithm moves per rank: a ring all-reduce of
``P`` bytes sends and receives ``2 (G-1)/G * P``; an all-gather sends this rank's block to
``G-1`` ranks and receives theirs; a broadcast of ``P`` bytes from the root sends ``(G-1) P``
and every other rank receives ``P``. Gloo may use another algorithm internally; the counts are
the logical traffic, the same on every backend.

Seconds come from a :class:`StepClock`: ``time.perf_counter`` on the CPU; on a CUDA device, CUDA events
(``torch.cuda.Event(enable_timing=True)``) recorded on the current stream around each wait and resolved once at the
end of the step (:meth:`CommStats.settle`), so a wait is the time the stream spent in the transfer, not the time it
took to launch it (NCCL calls return to the host before the transfer ends).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

KINDS = ("stage_activations", "stage_gradients", "halo_embeddings", "halo_gradients", "weight_allreduce", "logits")
"""Kinds of traffic, the keys of :attr:`CommStats.bytes_sent` and :attr:`CommStats.bytes_recv`."""


def nbytes(t: Tensor) -> int:
    """Return the payload of a tensor in bytes."""
    return t.numel() * t.element_size()


class StepClock:
    """Timestamps of one step: ``time.perf_counter`` on the CPU, CUDA events on a CUDA device.

    Args:
        device: Where the timed work runs (default: the CPU).
    """

    def __init__(self, device: Optional[torch.device] = None) -> None:
        self.cuda = device is not None and torch.device(device).type == "cuda"
        self.device = device

    def mark(self) -> Any:
        """A timestamp: a float (seconds) on the CPU, a recorded ``torch.cuda.Event`` on CUDA."""
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, origin: Any, mark: Any) -> float:
        """Seconds from ``origin`` to ``mark`` (on CUDA, call :meth:`wait` first)."""
        return origin.elapsed_time(mark) / 1e3 if self.cuda else mark - origin

    def wait(self) -> None:
        """Wait for the device's queued work (a no-op on the CPU)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)


def ring_all_reduce_bytes(world: int, nbytes: int) -> int:
    """Bytes one rank sends (and receives) in a ring all-reduce of ``nbytes`` bytes over ``world`` ranks:
    ``2 (world - 1) / world`` of them (reduce-scatter, then all-gather; Patarasuk and Yuan, JPDC 2009), rounded
    down. Raises nothing; ``world`` >= 1."""
    return 2 * (world - 1) * nbytes // world


@dataclass
class CommStats:
    """One rank's communication in one training step (= one epoch: one full-graph step).

    Attributes:
        bytes_sent: Bytes this rank sent, per kind of :data:`KINDS`.
        bytes_recv: Bytes this rank received, per kind.
        wait_s: Seconds this rank was blocked in communication outside pipeline fill/drain.
        bubble_s: Seconds of pipeline fill and drain on this rank (0 without a pipeline).
        compute_s: Seconds of stage compute (pipeline only; 0 where not measured).
        step_s: Seconds of the whole step on this rank.
        clock: How seconds are taken (kept by :meth:`reset`; set it to the device's clock once the device is known).
    """

    bytes_sent: Dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    bytes_recv: Dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    wait_s: float = 0.0
    bubble_s: float = 0.0
    compute_s: float = 0.0
    step_s: float = 0.0
    clock: StepClock = field(default_factory=StepClock, repr=False, compare=False)
    _pending: List[Tuple[Any, Any]] = field(default_factory=list, repr=False, compare=False)

    def record(self, kind: str, sent: int = 0, recv: int = 0) -> None:
        """Add ``sent`` and ``recv`` bytes of traffic of ``kind``.

        Raises:
            ValueError: Unknown kind.
        """
        if kind not in self.bytes_sent:
            raise ValueError(f"CommStats.record: unknown kind {kind!r}. Valid kinds: {list(KINDS)}.")
        self.bytes_sent[kind] += int(sent)
        self.bytes_recv[kind] += int(recv)

    def record_broadcast(self, kind: str, tensor: Tensor, src: int, rank: int, world: int) -> None:
        """Count a broadcast of ``tensor`` from ``src`` to ``world - 1`` ranks.

        Args:
            kind: One of :data:`KINDS`.
            tensor: The broadcast tensor (its bytes are counted).
            src: Rank that sends, within the ``world`` ranks of the collective.
            rank: This rank, in the same numbering.
            world: Ranks in the collective.

        Raises:
            ValueError: Unknown kind.
        """
        if rank == src:
            self.record(kind, sent=nbytes(tensor) * (world - 1))
        else:
            self.record(kind, recv=nbytes(tensor))

    def record_all_gather(self, kind: str, tensor: Tensor, world: int) -> None:
        """Count an all-gather of one ``tensor`` per rank (all of the same size).

        Args:
            kind: One of :data:`KINDS`.
            tensor: This rank's contribution (its bytes are counted).
            world: Ranks in the collective.

        Raises:
            ValueError: Unknown kind.
        """
        self.record(kind, sent=nbytes(tensor) * (world - 1), recv=nbytes(tensor) * (world - 1))

    def record_all_reduce(self, kind: str, tensor: Tensor, world: int) -> None:
        """Count a ring all-reduce of ``tensor``: ``2 (G-1)/G`` of its bytes each way.

        Args:
            kind: One of :data:`KINDS`.
            tensor: The reduced tensor (its bytes are counted).
            world: ``G``, ranks in the collective.

        Raises:
            ValueError: Unknown kind.
        """
        moved = ring_all_reduce_bytes(world, nbytes(tensor))
        self.record(kind, sent=moved, recv=moved)

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Add the seconds spent inside the block to :attr:`wait_s` (on CUDA once :meth:`settle` runs)."""
        start = self.clock.mark()
        try:
            yield
        finally:
            end = self.clock.mark()
            if self.clock.cuda:
                self._pending.append((start, end))
            else:
                self.wait_s += end - start

    def settle(self) -> None:
        """Add the waits timed with CUDA events to :attr:`wait_s` (after ``clock.wait()``; a no-op on the CPU)."""
        self.wait_s += sum(self.clock.seconds(start, end) for start, end in self._pending)
        self._pending = []

    def reset(self) -> None:
        """Zero every count (called at the start of each training step); the clock stays."""
        fresh = CommStats(clock=self.clock)
        self.__dict__.update(fresh.__dict__)

    @property
    def total_sent(self) -> int:
        """Bytes this rank sent in the step, all kinds together."""
        return sum(self.bytes_sent.values())

    def vector(self, device: Optional[torch.device] = None) -> Tensor:
        """Pack the counts into ``(2 * len(KINDS) + 4,)`` float64 on ``device``: sent and recv (bytes), wait, bubble,
        compute and step (seconds)."""
        values: List[float] = [float(self.bytes_sent[k]) for k in KINDS] + [float(self.bytes_recv[k]) for k in KINDS]
        return torch.tensor(values + [self.wait_s, self.bubble_s, self.compute_s, self.step_s], dtype=torch.float64,
                            device=device)

    def world_metrics(self, group=None, device: Optional[torch.device] = None) -> Dict[str, float]:
        """Gather every rank's counts and return the metrics every rank logs.

        A collective: every rank of ``group`` must call it, with ``device`` the process group's device (the GPU
        under NCCL). Keys: ``comm/sent/<kind>`` (bytes,
        summed over ranks; every byte is sent once, so this is the traffic on the network),
        ``comm/sent_total``, and per rank ``r``: ``comm/wait_s/rank<r>``,
        ``comm/bubble_s/rank<r>``, ``comm/compute_s/rank<r>``, ``comm/step_s/rank<r>`` (seconds).
        """
        world = dist.get_world_size(group) if dist.is_initialized() else 1
        mine = self.vector(device)
        rows = [torch.empty_like(mine) for _ in range(world)]
        if world > 1:
            dist.all_gather(rows, mine, group=group)
        else:
            rows = [mine]
        table = torch.stack(rows)
        n = len(KINDS)
        out = {f"comm/sent/{k}": float(table[:, i].sum()) for i, k in enumerate(KINDS)}
        out["comm/sent_total"] = float(table[:, :n].sum())
        for r in range(world):
            for j, name in enumerate(("wait_s", "bubble_s", "compute_s", "step_s")):
                out[f"comm/{name}/rank{r}"] = float(table[r, 2 * n + j])
        return out


def log_comm(module: Any, stats: CommStats, group=None) -> Dict[str, float]:
    """Gather every rank's counts over ``group`` (default: the world); log them per epoch from the current ``*_step``.

    Every rank logs the same gathered values (see :meth:`CommStats.world_metrics`), so the
    loggers, which write on rank 0 only, see every stage's figures. The epoch's value is the sum over its training
    steps (bytes and seconds of the whole epoch; one step an epoch unless the DataModule runs several).
    """
    metrics = stats.world_metrics(group=group, device=module.device)
    module.log_dict(metrics, on_step=False, on_epoch=True, batch_size=1, sync_dist=True,  # same on every rank
                    reduce_fx="sum")
    return metrics
