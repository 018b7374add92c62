"""Run the user's ``training_step`` for its loss alone: no logging, no metric updates.

Under 1F1B with a row-separable loss (:mod:`~lightning_gnnpipe.pipeline.separable`) the last stage evaluates the
user's ``training_step`` once per chunk on a full-graph output whose other rows are placeholders, to get that
chunk's gradient. Those calls must not log or update torchmetrics states (their values are partial); the step is
run once more on the finished output, normally, for what it logs and returns. While :func:`quiet_step` is open,
``self.log`` / ``self.log_dict`` do nothing and every torchmetrics ``Metric`` of the module neither updates nor
returns a value from the calls (``metric(preds, target)`` returns a zero tensor); everything is restored on exit.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, List, Tuple

import torch
from torch import nn
from torchmetrics import Metric

_MISSING = object()


def _no_log(*_: Any, **__: Any) -> None:
    return None


def _no_metric_value(*_: Any, **__: Any) -> torch.Tensor:
    return torch.zeros(())


@contextmanager
def quiet_step(module: nn.Module) -> Iterator[None]:
    """Silence ``module``'s logging and freeze its torchmetrics states while the context is open.

    Instance attributes are set on the module and its metrics and put back as they were (an attribute the instance
    held before is restored, one it did not hold is removed), so a ``log`` the user assigned on the instance survives.
    """
    saved: List[Tuple[Any, str, Any]] = []

    def swap(obj: Any, name: str, value: Any) -> None:
        saved.append((obj, name, obj.__dict__.get(name, _MISSING)))
        object.__setattr__(obj, name, value)

    swap(module, "log", _no_log)
    swap(module, "log_dict", _no_log)
    for metric in module.modules():
        if isinstance(metric, Metric):
            swap(metric, "update", _no_log)
            swap(metric, "forward", _no_metric_value)
    try:
        yield
    finally:
        for obj, name, old in reversed(saved):
            if old is _MISSING:
                object.__delattr__(obj, name)
            else:
                object.__setattr__(obj, name, old)
