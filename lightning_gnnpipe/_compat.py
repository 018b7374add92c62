"""Every private torch / Lightning / PyG API that lightning_gnnpipe touches, in one place.

Each name below was checked against torch 2.13.0, lightning 2.6.6 and torch_geometric 2.8.1 (the versions
``pyproject.toml`` pins). Each comment names the public alternative where one exists and why it is not used.
Nothing else in the package imports a name that starts with ``_`` from those libraries, reads a private attribute
of their objects, or overrides or reads a private member of their classes in a subclass (``tests/test_layout.py``
checks these three), nor replaces the methods of their objects (:func:`wrap_pipeline_calls` does, here).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, List

# torch 2.13 deprecates ``isinstance(x, LeafSpec)`` and warns (FutureWarning) on every ``LeafSpec()`` that Lightning
# 2.6's ``CombinedLoader`` builds (lightning/pytorch/utilities/_pytree.py:21): in every process of every fit, about
# the libraries' code, nothing a user can act on. Silenced for that message only (torch 2.11 does not warn).
LEAFSPEC_DEPRECATION = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
warnings.filterwarnings("ignore", message=LEAFSPEC_DEPRECATION, category=FutureWarning)

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
    "LauncherHook",
    "MultiProcessingLauncher",
    "SubprocessScriptLauncher",
    "default_process_group_backend",
    "has_forward_pre_hooks",
    "init_dist_connection",
    "optimizers_to_device",
    "pipeline_stages",
    "sync_ddp_if_available",
    "wrap_pipeline_calls",
]


def pipeline_stages(schedule: Any) -> List[Any]:
    """Return the ``PipelineStage`` objects of a ``torch.distributed.pipelining`` schedule.

    torch 2.13 keeps them in ``schedule._stage`` (single-stage schedules: GPipe, 1F1B) or ``schedule._stages``
    (multi-stage ones). No public accessor exists; the strategy built the stages itself, but the recorder wraps
    the very objects the schedule runs, so it reads them from the schedule.
    """
    return list(schedule._stages) if hasattr(schedule, "_stages") else [schedule._stage]


STAGE_TRANSFERS = (("get_fwd_send_ops", "stage_activations"), ("get_fwd_recv_ops", "stage_activations"),
                   ("get_bwd_send_ops", "stage_gradients"), ("get_bwd_recv_ops", "stage_gradients"))
"""The ``PipelineStage`` methods that build each stage-boundary transfer (``dist.P2POp`` lists), with what they
carry."""

STAGE_COMPUTE = (("forward_one_chunk", "fwd"), ("backward_one_chunk", "bwd"), ("backward_weight_one_chunk", "bwd"))
"""The ``PipelineStage`` methods that compute one chunk (the zero-bubble schedules' weight pass counts as backward)."""


def wrap_pipeline_calls(schedule: Any, transfers: Callable[[Callable, str], Callable],
                        compute: Callable[[Callable, str], Callable]) -> None:
    """Replace, on every stage of ``schedule``, the methods its schedule calls for each transfer and each chunk.

    torch 2.13's schedules build every stage-boundary transfer by calling the stage's :data:`STAGE_TRANSFERS`
    methods, compute through :data:`STAGE_COMPUTE`, and the loss through ``schedule._maybe_compute_loss``; no
    public callback exists. Each method ``m`` of those becomes ``transfers(m, kind)`` (``kind``:
    ``"stage_activations"`` or ``"stage_gradients"``) or ``compute(m, action)`` (``action``: ``"fwd"``,
    ``"bwd"``, ``"loss"``) on that object only. Used by :mod:`~lightning_gnnpipe.pipeline.recorder` to count the
    bytes that cross a boundary and time each chunk's compute.
    """
    for stage in pipeline_stages(schedule):
        for name, kind in STAGE_TRANSFERS:
            setattr(stage, name, transfers(getattr(stage, name), kind))
        for name, action in STAGE_COMPUTE:
            setattr(stage, name, compute(getattr(stage, name), action))
    schedule._maybe_compute_loss = compute(schedule._maybe_compute_loss, "loss")


class LauncherHook:
    """Give a Lightning strategy its launcher through Lightning 2.6's private hook.

    Lightning's accelerator connector calls ``Strategy._configure_launcher()`` once the strategy has its cluster
    environment, and ``Strategy.launcher`` returns what the hook stored in ``Strategy._launcher``. No public route
    exists (every strategy in ``lightning.pytorch.strategies`` overrides the hook). A strategy that lists this class
    before its Lightning base implements :meth:`make_launcher` instead.
    """

    def _configure_launcher(self) -> None:
        self._launcher = self.make_launcher()

    def make_launcher(self) -> Any:
        """Return the launcher Lightning starts the processes with (``None``: run in this process)."""
        raise NotImplementedError


def has_forward_pre_hooks(module: Any) -> bool:
    """Whether a forward pre-hook may change what ``module`` (or any module in it) gets: one registered on one of its
    modules (``Module.register_forward_pre_hook``) or for every module (``register_module_forward_pre_hook``).

    torch 2.13 keeps them in ``Module._forward_pre_hooks`` and ``torch.nn.modules.module._global_forward_pre_hooks``;
    no public accessor exists.
    """
    from torch.nn.modules import module as torch_module

    return bool(torch_module._global_forward_pre_hooks) or any(m._forward_pre_hooks for m in module.modules())
