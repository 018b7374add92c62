"""The history tables over a run: exact refreshes, the per-epoch switch, and the staleness metrics.

GNNPipe (arXiv 2308.10087, Sec. 4.2) reads halo rows of chunks that come later in an epoch from the last epoch's
tables. Around that core this module runs, once per epoch and on every rank:

* an optional exact refresh (every ``refresh_every`` epochs, and at the start of fit unless the tables were
  restored from a checkpoint): one no-grad full-graph forward writes every layer's exact input into its table and
  measures the drift ``||h_hist - h_exact|| / ||h_exact||`` first;
* the epoch switch of each stage (:meth:`~lightning_gnnpipe.pipeline.stage.GNNStage.next_epoch`: NodeDropout's
  masks, stale halo gradients);
* the staleness metrics ``gnnpipe/stale_edge_fraction``, ``gnnpipe/stale_age_epochs`` (epochs), and with a refresh
  ``gnnpipe/refresh_seconds`` (seconds) and ``gnnpipe/drift_layer{l}``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch.distributed as dist
from torch import nn

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
        stale_stats: ``(fraction of edges read historical, their mean age in epochs)`` of the chunk order.
    """

    def __init__(self, stages: Sequence[nn.Module], full_forward: FullForward, refresh_every: int = 0,
                 log_staleness: bool = True, stale_stats: Tuple[float, float] = (0.0, 0.0)) -> None:
        self.stages, self.full_forward = list(stages), full_forward
        self.refresh_every, self.log_staleness, self.stale_stats = refresh_every, log_staleness, stale_stats

    def refresh(self) -> Dict[int, float]:
        """Refill every stage's history tables with an exact no-grad full-graph forward (a collective).

        Returns:
            Drift ``||h_hist - h_exact|| / ||h_exact||`` per refreshed layer over the rows of every rank's table of
            it (:func:`combine_drift`).
        """
        drift: Dict[int, Tuple[float, float]] = {}
        with eval_mode(self.stages):
            self.full_forward(write_history=True, drift=drift)
        gathered: List[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, drift)
        return combine_drift(gathered)

    def before_epoch(self, epoch: int, log: Optional[Callable[[str, float], None]] = None) -> None:
        """Start training epoch ``epoch``: periodic refresh, the stages' epoch switch, staleness metrics.

        Args:
            epoch: The epoch that starts.
            log: ``log(name, value)`` for the metrics (the LightningModule's ``log``, once per epoch).
        """
        if self.refresh_every and epoch > 0 and epoch % self.refresh_every == 0:
            start = time.perf_counter()
            drift = self.refresh()
            if self.log_staleness and log is not None:
                log("gnnpipe/refresh_seconds", time.perf_counter() - start)
                for layer, value in sorted(drift.items()):
                    log(f"gnnpipe/drift_layer{layer}", value)
        for stage in self.stages:
            stage.next_epoch(epoch)
        if self.log_staleness and log is not None:
            log("gnnpipe/stale_edge_fraction", self.stale_stats[0])
            log("gnnpipe/stale_age_epochs", self.stale_stats[1])


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
