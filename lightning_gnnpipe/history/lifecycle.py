"""The history tables over a run: exact refreshes, the per-epoch switch, and the staleness metrics.

GNNPipe (arXiv 2308.10087, Sec. 4.2) reads halo rows of chunks that come later in an epoch from the last epoch's
tables. Around that core this module runs, once per epoch and on every rank:

* an optional exact refresh (every ``refresh_every`` epochs, and at the start of fit unless the tables were
  restored from a checkpoint): one no-grad full-graph forward writes every layer's exact input into its table and
  measures the drift ``||h_hist - h_exact|| / ||h_exact||`` first. The validation just before a due refresh runs
  that forward and writes the tables (:meth:`HistoryLifecycle.refresh_in_evaluation`); the refresh then costs no
  second forward unless the weights changed since (checked on every rank);
* the epoch switch of each stage (:meth:`~lightning_gnnpipe.pipeline.stage.GNNStage.next_epoch`: NodeDropout's
  masks, stale halo gradients);
* the staleness metrics ``gnnpipe/stale_edge_fraction``, ``gnnpipe/stale_age_epochs`` (epochs), and with a refresh
  ``gnnpipe/refresh_seconds`` (seconds) and ``gnnpipe/drift_layer{l}``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lightning_gnnpipe.history.history import drift_of
from lightning_gnnpipe.nn.stack import eval_mode

FullForward = Callable[..., Any]
"""``full_forward(write_history=True, drift=dict)``: the exact full-graph forward through every stage."""


class HistoryLifecycle:
    """Refreshes and per-epoch bookkeeping of this rank's history tables.

    Args:
        stages: This rank's stage modules (each with ``next_epoch(epoch)``).
        full_forward: The exact forward through all stages (a collective over the pipeline).
        refresh_every: Refresh every this many epochs (0: never).
        log_staleness: Log the staleness metrics.
        stale_stats: ``stale_stats(epoch) -> (fraction of edges read historical, their mean age in epochs)``, logged
            at the epoch's start.
        autocast: Whether evaluation runs under autocast (``bf16-mixed``); a refresh runs in full precision, so
            then no evaluation doubles as one (:meth:`refreshes_in_evaluation`).
    """

    def __init__(self, stages: Sequence[nn.Module], full_forward: FullForward, refresh_every: int = 0,
                 log_staleness: bool = True,
                 stale_stats: Callable[[int], Tuple[float, float]] = lambda epoch: (0.0, 0.0),
                 autocast: bool = False) -> None:
        self.stages, self.full_forward, self.autocast = list(stages), full_forward, autocast
        self.refresh_every, self.log_staleness, self.stale_stats = refresh_every, log_staleness, stale_stats
        self._refreshed: Optional[tuple] = None  # (epoch, step, drift, weights used) of a refresh run in validation
        self.epoch: Optional[int] = None  # the training epoch begun last (before_epoch)

    def refresh(self) -> Dict[int, float]:
        """Refill every stage's history tables with an exact no-grad full-graph forward (a collective).

        Returns:
            Drift ``||h_hist - h_exact|| / ||h_exact||`` per refreshed layer over the rows of every rank's table of
            it (:func:`combine_drift`).
        """
        return self._refresh()[1]

    def _refresh(self) -> Tuple[Any, Dict[int, float]]:
        drift: Dict[int, Tuple[float, float]] = {}
        with eval_mode(self.stages):
            logits = self.full_forward(write_history=True, drift=drift)
        gathered: List[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, drift)
        return logits, combine_drift(gathered)

    def due(self, epoch: int) -> bool:
        """Whether training epoch ``epoch`` starts with a periodic refresh."""
        return bool(self.refresh_every) and epoch > 0 and epoch % self.refresh_every == 0

    def refreshes_in_evaluation(self, trainer: Any) -> bool:
        """Whether the evaluation running now should be the refresh that the next training epoch is due (the same
        answer on every rank): a fit's validation (not its sanity check) at the end of an epoch that is not the last
        (not one in the middle of an epoch, ``val_check_interval < 1``), in full precision (a refresh does not run
        under autocast), not already done at this optimizer step.

        Args:
            trainer: The Lightning ``Trainer`` (its state, ``current_epoch``, ``global_step``, ``max_epochs``, the fit
                loop's ``is_last_batch``).
        """
        epoch, last = trainer.current_epoch + 1, trainer.max_epochs
        in_fit = trainer.state.fn == "fit" and trainer.validating and not trainer.sanity_checking \
            and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        early = self._refreshed is not None and self._refreshed[:2] == (epoch, trainer.global_step)
        final = last is not None and 0 <= last <= epoch  # no epoch follows
        return in_fit and not self.autocast and self.due(epoch) and not early and not final

    def refresh_in_evaluation(self, trainer: Any) -> Any:
        """Run the refresh that the next training epoch is due now, as the evaluation's exact forward (a collective).

        The validation of a fit runs the exact forward of the weights the next epoch starts from; with a refresh
        due there (:meth:`refreshes_in_evaluation`), this one forward serves both: it returns the logits
        ``(|V|, C)`` on every rank and writes the tables. :meth:`before_epoch` of that epoch then skips its own
        forward if the optimizer step count (``trainer.global_step``, the same on every rank) is unchanged and every
        stage's parameters still equal the ones this forward used (a callback may swap in averaged weights for
        validation, or change them at the epoch's end).
        """
        logits, drift = self._refresh()
        used = [p.detach().clone() for stage in self.stages for p in stage.parameters()]
        self._refreshed = (trainer.current_epoch + 1, trainer.global_step, drift, used)
        return logits

    def _same_weights(self, used: List[Tensor]) -> bool:
        """Whether every rank's stage parameters equal ``used`` (a collective: the same answer on every rank)."""
        now = [p for stage in self.stages for p in stage.parameters()]
        same = len(now) == len(used) and all(torch.equal(a.detach(), b) for a, b in zip(now, used))
        gathered: List[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, same)
        return all(gathered)

    def before_epoch(self, epoch: int, log: Optional[Callable[[str, float], None]] = None,
                     step: Optional[int] = None) -> None:
        """Start training epoch ``epoch``: periodic refresh, the stages' epoch switch, staleness metrics; once an
        epoch (a later call for the same epoch, its next training step, does nothing).

        Args:
            epoch: The epoch that starts.
            log: ``log(name, value)`` for the metrics (the LightningModule's ``log``, once per epoch).
            step: The optimizer steps taken so far (``trainer.global_step``, the same on every rank): a refresh
                that :meth:`refresh_in_evaluation` ran at this ``(epoch, step)`` with the same weights is not run
                again (its ``gnnpipe/refresh_seconds`` is then about 0).
        """
        if epoch == self.epoch:
            return
        self.epoch = epoch
        early, self._refreshed = self._refreshed, None
        if self.due(epoch):
            start = time.perf_counter()
            if early is not None and early[:2] == (epoch, step) and self._same_weights(early[3]):
                drift = early[2]  # the validation's forward was this refresh
            else:
                drift = self.refresh()
            seconds = time.perf_counter() - start
            if self.log_staleness and log is not None:
                log("gnnpipe/refresh_seconds", seconds)
                for layer, value in sorted(drift.items()):
                    log(f"gnnpipe/drift_layer{layer}", value)
        for stage in self.stages:
            stage.next_epoch(epoch)
        if self.log_staleness and log is not None:
            fraction, age = self.stale_stats(epoch)
            log("gnnpipe/stale_edge_fraction", fraction)
            log("gnnpipe/stale_age_epochs", age)


def combine_drift(parts: Sequence[Dict[int, Tuple[float, float]]]) -> Dict[int, float]:
    """Per layer, the drift over the rows of all tables of it: ``sqrt(sum ||old - exact||^2 / sum ||exact||^2)``.

    Args:
        parts: Per rank, layer -> the squared norms of :meth:`~lightning_gnnpipe.history.history.History.refresh`
            (the ranks of one hybrid stage hold the same layer's tables for different rows).
    """
    sums: Dict[int, Tuple[float, float]] = {}
    for part in parts:
        for layer, (diff, norm) in part.items():
            d, n = sums.get(layer, (0.0, 0.0))
            sums[layer] = (d + diff, n + norm)
    return {layer: drift_of(squares) for layer, squares in sorted(sums.items())}
