"""Every private torch / Lightning / PyG API that lightning_gnnpipe touches, in one place.

Each name below was checked against torch 2.13.0, lightning 2.6.6 and torch_geometric 2.8.1 (the versions
``pyproject.toml`` pins). Each comment names the public alternative where one exists and why it is not used.
Nothing else in the package imports a name that starts with ``_`` from those libraries, or reads a private
attribute of their objects; ``tests/test_layout.py`` checks it.
"""

from __future__ import annotations

from typing import Any, List

# Lightning 2.6: the launchers Lightning's own DDPStrategy uses. No public launcher class exists; a strategy
# that wants spawn/popen/torchrun support has to reuse these (as every strategy in lightning.pytorch does).
from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher as MultiProcessingLauncher
from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher as SubprocessScriptLauncher

# Lightning 2.6: create the default process group from the cluster environment (MASTER_ADDR/PORT, ranks), as
# DDPStrategy does. Public alternative: torch.distributed.init_process_group with the environment's values by
# hand; this one also sets the env variables torchrun expects and logs like every Lightning strategy.
from lightning.fabric.utilities.distributed import _init_dist_connection as init_dist_connection

# Lightning 2.6: "gloo" for CPU, "nccl" for CUDA. Public alternative: none in Lightning; torch's
# torch.distributed.Backend.default_device_backend_map is the same table.
from lightning.fabric.utilities.distributed import (
    _get_default_process_group_backend_for_device as default_process_group_backend,
)

# Lightning 2.6: all-reduce for ``Strategy.reduce`` (mean/sum, as DDPStrategy.reduce). Public alternative:
# torch.distributed.all_reduce plus Lightning's own reduce-op parsing.
from lightning.fabric.utilities.distributed import _sync_ddp_if_available as sync_ddp_if_available

# Lightning 2.6: move optimizer state to the device after a checkpoint restore (DDPStrategy.setup does this).
from lightning.fabric.utilities.optimizer import _optimizers_to_device as optimizers_to_device

# torch 2.13: the common base classes of BatchNorm1d/2d/3d and InstanceNorm1d/2d/3d. Public alternative: the
# tuple of concrete classes, which misses SyncBatchNorm/LazyBatchNorm subclasses users may hold.
from torch.nn.modules.batchnorm import _BatchNorm as BatchNormBase
from torch.nn.modules.instancenorm import _InstanceNorm as InstanceNormBase

__all__ = [
    "BatchNormBase",
    "InstanceNormBase",
    "MultiProcessingLauncher",
    "SubprocessScriptLauncher",
    "default_process_group_backend",
    "init_dist_connection",
    "optimizers_to_device",
    "pipeline_stages",
    "wrap_schedule_loss",
    "sync_ddp_if_available",
]


def pipeline_stages(schedule: Any) -> List[Any]:
    """Return the ``PipelineStage`` objects of a ``torch.distributed.pipelining`` schedule.

    torch 2.13 keeps them in ``schedule._stage`` (single-stage schedules: GPipe, 1F1B) or ``schedule._stages``
    (multi-stage ones). No public accessor exists; the strategy built the stages itself, but the recorder wraps
    the very objects the schedule runs, so it reads them from the schedule.
    """
    return list(schedule._stages) if hasattr(schedule, "_stages") else [schedule._stage]


def wrap_schedule_loss(schedule: Any, wrap: Any) -> None:
    """Replace the schedule's loss call ``schedule._maybe_compute_loss`` (torch 2.13) by ``wrap(original)``.

    Used only to time the loss for the pipeline timeline (:mod:`~lightning_gnnpipe.pipeline.recorder`); the
    public ``loss_fn`` is the strategy's own and is timed there too, but the schedule's call also covers the
    target bookkeeping around it.
    """
    schedule._maybe_compute_loss = wrap(schedule._maybe_compute_loss)
