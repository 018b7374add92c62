"""Lightning's spawn launcher, with the GNNPipe checks run in the main process first."""

from __future__ import annotations

from typing import Any, Callable, Optional

from lightning.pytorch import LightningDataModule, LightningModule, Trainer

from lightning_gnnpipe._compat import MultiProcessingLauncher
from lightning_gnnpipe.strategy.precision import check_precision


class CheckedMultiProcessingLauncher(MultiProcessingLauncher):
    """Validate the model and DataModule before any worker (and process group) starts.

    Also fixes the loggers' run versions in the main process. A bad layout then raises its own
    clear error in the user's process instead of a traceback relayed from a spawned worker. In
    the workers, an error gets a note naming the rank and stage that raised it (see
    :mod:`~lightning_gnnpipe.strategy.failures`); the main process re-raises it with that note.
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
        return super().launch(function, *args, trainer=trainer, **kwargs)

    def _wrapping_function(self, process_idx: int, *args: Any, **kwargs: Any) -> None:
        try:
            super()._wrapping_function(process_idx, *args, **kwargs)
        except BaseException as exc:
            self._strategy.on_exception(exc)
            raise
