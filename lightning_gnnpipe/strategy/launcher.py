"""Lightning's launchers, with the GNNPipe checks run in the main process first and the ranks' allocator settings."""

from __future__ import annotations

from typing import Any, Callable, Optional

from lightning.pytorch import LightningDataModule, LightningModule, Trainer

from lightning_gnnpipe._compat import MultiProcessingLauncher, SubprocessScriptLauncher
from lightning_gnnpipe.strategy.allocator import huge_pages_for_new_processes
from lightning_gnnpipe.strategy.precision import check_precision


class CheckedMultiProcessingLauncher(MultiProcessingLauncher):
    """Validate the model and DataModule before any worker (and process group) starts.

    Also fixes the loggers' run versions in the main process. A bad layout then raises its own
    clear error in the user's process instead of a traceback relayed from a spawned worker. In
    the workers, an error gets a note naming the rank and stage that raised it (see
    :mod:`~lightning_gnnpipe.strategy.failures`); the main process re-raises it with that note. With the strategy's
    ``huge_pages``, the workers start with torch's transparent huge pages on
    (:func:`~lightning_gnnpipe.strategy.allocator.huge_pages_for_new_processes`).
    """

    def launch(self, function: Callable, *args: Any, trainer: Optional[Trainer] = None, **kwargs: Any) -> Any:
        module = next((a for a in args if isinstance(a, LightningModule)), None)
        datamodule = next((a for a in args if isinstance(a, LightningDataModule)), None)
        if trainer is not None and module is not None:
            self._strategy.check(trainer, module=module, datamodule=datamodule)
            check_precision(self._strategy.precision_plugin, type(self._strategy).__name__)
        if trainer is not None:
            # Pin each logger's version here, once, so that fit and a later test of the same
            # Trainer write into one run directory instead of each worker picking the next one.
            for logger in trainer.loggers:
                _ = logger.version
        with huge_pages_for_new_processes(self._strategy.huge_pages):
            return super().launch(function, *args, trainer=trainer, **kwargs)

    def _wrapping_function(self, process_idx: int, *args: Any, **kwargs: Any) -> None:
        try:
            super()._wrapping_function(process_idx, *args, **kwargs)
        except BaseException as exc:
            self._strategy.on_exception(exc)
            raise


class HugePageScriptLauncher(SubprocessScriptLauncher):
    """Lightning's popen launcher; with ``huge_pages`` the ranks it starts (all but rank 0, the user's own process)
    start with torch's transparent huge pages on. Under torchrun/SLURM it starts nothing."""

    def __init__(self, *args: Any, huge_pages: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.huge_pages = huge_pages

    def launch(self, function: Callable, *args: Any, trainer: Optional[Trainer] = None, **kwargs: Any) -> Any:
        with huge_pages_for_new_processes(self.huge_pages):
            return super().launch(function, *args, trainer=trainer, **kwargs)
