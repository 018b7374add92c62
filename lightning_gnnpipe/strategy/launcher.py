"""Lightning's launchers, with the GNNPipe checks run in the main process first and the ranks' allocator settings."""

from __future__ import annotations

import atexit
from typing import Any, Callable, Optional

import torch.distributed as dist
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.strategies import Strategy

from lightning_gnnpipe._compat import MultiProcessingLauncher, SubprocessScriptLauncher
from lightning_gnnpipe.strategy.allocator import launch_environment
from lightning_gnnpipe.strategy.precision import check_precision


class CheckedMultiProcessingLauncher(MultiProcessingLauncher):
    """Validate the model and DataModule before any worker (and process group) starts.

    Also fixes the loggers' run versions in the main process. A bad layout then raises its own
    clear error in the user's process instead of a traceback relayed from a spawned worker. In
    the workers, an error gets a note naming the rank and stage that raised it (:class:`NotingFailures`,
    :mod:`~lightning_gnnpipe.strategy.failures`); the main process re-raises it with that note. With the strategy's
    ``huge_pages``, the workers start with torch's transparent huge pages on; either way they know the strategy
    started them (:func:`~lightning_gnnpipe.strategy.allocator.launch_environment`).
    """

    def __init__(self, strategy: Strategy, start_method: str = "spawn") -> None:
        super().__init__(strategy, start_method=start_method)
        self.strategy = strategy

    def launch(self, function: Callable, *args: Any, trainer: Optional[Trainer] = None, **kwargs: Any) -> Any:
        module = next((a for a in args if isinstance(a, LightningModule)), None)
        datamodule = next((a for a in args if isinstance(a, LightningDataModule)), None)
        if trainer is not None and module is not None:
            self.strategy.check(trainer, module=module, datamodule=datamodule)
            check_precision(self.strategy.precision_plugin, type(self.strategy).__name__)
        if trainer is not None:
            # Pin each logger's version here, once, so that fit and a later test of the same
            # Trainer write into one run directory instead of each worker picking the next one.
            for logger in trainer.loggers:
                _ = logger.version
        with launch_environment(self.strategy.huge_pages):
            return super().launch(NotingFailures(function, self.strategy), *args, trainer=trainer, **kwargs)


class NotingFailures:
    """``function`` run in a worker; an error it raises first goes to ``strategy.on_exception`` (which names the rank).

    Lightning's ``Trainer`` hands an error to ``Strategy.on_exception`` only in the process that called ``fit``; the
    spawned workers run ``function`` outside that handler. Picklable: spawn sends it to every worker.
    """

    def __init__(self, function: Callable, strategy: Strategy) -> None:
        self.function, self.strategy = function, strategy

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.function(*args, **kwargs)
        except BaseException as exc:
            self.strategy.on_exception(exc)
            raise


_exit_hook_registered = False


def destroy_groups_at_exit() -> None:
    """In a rank process the strategy started (spawn or popen), destroy its process groups at exit, while the
    interpreter is still whole; registered once per process. Left to the interpreter's finalization, gloo's worker
    threads can still hold work whose tensors then need the GIL, and a rank dies with ``terminate called without an
    active exception`` (SIGABRT) after a fit that succeeded (the cause pytorch/pytorch#179291 names). Raises nothing;
    the user's own process (rank 0 under popen, torchrun and SLURM ranks) is left alone by the caller."""
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(_destroy_process_groups)
        _exit_hook_registered = True


def _destroy_process_groups() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class HugePageScriptLauncher(SubprocessScriptLauncher):
    """Lightning's popen launcher: the ranks it starts (all but rank 0, the user's own process) know the strategy
    started them and, with ``huge_pages``, start with torch's transparent huge pages on
    (:func:`~lightning_gnnpipe.strategy.allocator.launch_environment`); rank 0's fit runs with the user's environment.
    Under torchrun/SLURM it starts nothing."""

    def __init__(self, *args: Any, huge_pages: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.huge_pages = huge_pages

    def launch(self, function: Callable, *args: Any, trainer: Optional[Trainer] = None, **kwargs: Any) -> Any:
        with launch_environment(self.huge_pages) as restore:
            def in_user_environment(*a: Any, **k: Any) -> Any:  # Lightning calls it once the other ranks started
                restore()
                return function(*a, **k)

            return super().launch(in_user_environment, *args, trainer=trainer, **kwargs)
