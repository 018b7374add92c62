"""Per-epoch insight that the strategies add to every fit: epoch time, memory, bubble, a trace.

The strategies already log, every epoch, the traffic and the step's time split per rank
(``comm/...``, :mod:`lightning_gnnpipe.comm.accounting`) and the staleness (``gnnpipe/...``).
:class:`PipelineInsight` adds what only the whole epoch shows, gathered from every rank so that
rank 0 (the only rank whose loggers write) logs every stage's figure, and every rank logs the
same values:

* ``time/epoch_s``: wall-clock seconds of the training epoch (``on_train_epoch_start`` to
  ``on_train_epoch_end``, so it includes the optimizer step and the epoch's validation), the
  slowest rank's; shown on the progress bar;
* ``memory/peak_bytes/rank<r>``: peak memory of rank ``r`` (= stage ``r`` under GNNPipe), in bytes.
  On CUDA, ``torch.cuda.max_memory_allocated`` over the epoch (reset at its start); on CPU the
  process's peak resident set size since it started (``getrusage``; it cannot be reset);
* ``memory/history_bytes/rank<r>`` and ``memory/graph_bytes/rank<r>``: bytes rank ``r`` keeps for the whole fit
  in history tables and in chunk graphs (ids, edge lists, CSR adjacencies), each storage counted once;
* ``memory/released_graph_bytes/rank<r>``: bytes of the shared graph (edge list; features on ranks without
  stage 0) whose pages rank ``r`` let go of after building its chunk graphs (0 where the graph is not in shared
  memory: torchrun, popen, forked ranks; :func:`~lightning_gnnpipe.strategy.allocator.release_shared_pages`);
* ``comm/bubble_fraction/rank<r>``: pipeline fill and drain as a fraction of the training step
  (``comm/bubble_s`` / ``comm/step_s``; 0 without a pipeline).

On request (``profile_epoch``) it also records the training step of one epoch with
``torch.profiler`` and writes one Chrome trace per rank (open in ``chrome://tracing`` or
Perfetto). The schedules mark each micro-batch as ``Forward <c>`` / ``Backward <c>``.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_warn


def peak_memory_bytes(device: torch.device) -> int:
    """Return this process's peak memory in bytes (CUDA: allocated by torch; CPU: peak RSS)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB


def bubble_fractions(comm_metrics: Dict[str, float]) -> Dict[str, float]:
    """Return ``comm/bubble_fraction/rank<r>`` from the gathered ``comm/bubble_s`` and ``comm/step_s``."""
    out = {}
    for key, bubble in comm_metrics.items():
        if key.startswith("comm/bubble_s/"):
            rank = key.rsplit("/", 1)[1]
            step = comm_metrics.get(f"comm/step_s/{rank}", 0.0)
            out[f"comm/bubble_fraction/{rank}"] = bubble / step if step > 0 else 0.0
    return out


class PipelineInsight(Callback):
    """Log epoch time, peak memory and bubble fraction of every rank; trace one epoch on request.

    Added to the Trainer's callbacks by :class:`~lightning_gnnpipe.GNNPipeStrategy` (and
    :class:`~lightning_gnnpipe.GraphParallelStrategy`); every rank runs it.

    Args:
        profile_epoch: Record the training step of this epoch (0-based) with ``torch.profiler``
            (``None``: never).
        trace_dir: Where to write ``gnnpipe_epoch<N>_rank<r>.json`` (default: ``traces/`` in the
            run directory of the first logger, else in ``default_root_dir``); only with ``profile_epoch``.

    Raises:
        ValueError: ``profile_epoch`` is not ``None`` or an int >= 0, or ``trace_dir`` is given without it.

    Warns:
        UserWarning: At the start of training, when ``profile_epoch`` is not one of the epochs the fit trains.
    """

    def __init__(self, profile_epoch: Optional[int] = None, trace_dir: Optional[str] = None) -> None:
        if profile_epoch is not None and (isinstance(profile_epoch, bool) or not isinstance(profile_epoch, int)
                                          or profile_epoch < 0):
            raise ValueError(
                f"GNNPipeStrategy: `profile_epoch` must be None or an int >= 0 epochs (got {profile_epoch!r})."
            )
        if trace_dir is not None and profile_epoch is None:
            raise ValueError(f"GNNPipeStrategy: `trace_dir` ({trace_dir!r}) is set but `profile_epoch` is None, so "
                             "no trace would be written. Pass profile_epoch=<epoch> to record one, or leave trace_dir "
                             "out.")
        self.profile_epoch = profile_epoch
        self.trace_dir = trace_dir
        self.trace_files: List[str] = []
        self._t0 = 0.0
        self._profiler: Optional[torch.profiler.profile] = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        last = trainer.max_epochs - 1 if trainer.max_epochs is not None and trainer.max_epochs >= 0 else None
        if self.profile_epoch is not None and (self.profile_epoch < trainer.current_epoch
                                               or last is not None and self.profile_epoch > last):
            rank_zero_warn(f"GNNPipeStrategy: `profile_epoch` ({self.profile_epoch}) is not among the epochs this fit "
                           f"trains ({trainer.current_epoch} to {last}), so no trace is written. Pick one of them.")
        if self.profile_epoch is not None and self.trace_dir is None:
            # trainer.log_dir broadcasts rank 0's run directory: every rank calls it here.
            self.trace_dir = os.path.join(trainer.log_dir or trainer.default_root_dir, "traces")

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            torch.cuda.synchronize(device)  # the epoch's time counts its kernels, not their launches
        self._t0 = time.perf_counter()

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if trainer.current_epoch == self.profile_epoch and batch_idx == 0:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if trainer.strategy.root_device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profiler = torch.profiler.profile(activities=activities)
            self._profiler.__enter__()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._profiler is None:
            return
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        assert self.trace_dir is not None
        os.makedirs(self.trace_dir, exist_ok=True)
        path = os.path.join(self.trace_dir, f"gnnpipe_epoch{trainer.current_epoch}_rank{trainer.global_rank}.json")
        profiler.export_chrome_trace(path)
        self.trace_files.append(path)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        strategy = trainer.strategy
        device = strategy.root_device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        kept = strategy.kept_bytes() if hasattr(strategy, "kept_bytes") else (0, 0)
        released = float(getattr(strategy, "released_graph_bytes", 0))
        mine = torch.tensor([time.perf_counter() - self._t0, float(peak_memory_bytes(device)), *map(float, kept),
                             released], dtype=torch.float64, device=device)
        rows = [mine]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
            dist.all_gather(rows, mine, group=getattr(strategy, "exchange_group", None))  # the exchange timeout
        # every rank logs the gathered values; sync_dist=True is the strategy's identity reduce (one data-parallel
        # replica) and keeps Lightning from asking for it
        log = dict(on_step=False, on_epoch=True, batch_size=1, sync_dist=True)
        pl_module.log("time/epoch_s", max(float(r[0]) for r in rows), prog_bar=True, **log)
        metrics = {f"memory/{kind}/rank{i}": float(r[k]) for i, r in enumerate(rows)
                   for k, kind in ((1, "peak_bytes"), (2, "history_bytes"), (3, "graph_bytes"),
                                   (4, "released_graph_bytes"))}
        metrics.update(bubble_fractions(getattr(strategy, "comm_metrics", {})))
        pl_module.log_dict(metrics, **log)
