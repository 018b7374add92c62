"""Lightning's spawn launcher, with the GNNPipe checks run in the main process first."""

from __future__ import annotations

from typing import Any, Callable, Optional

from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher


class _CheckedMultiProcessingLauncher(_MultiProcessingLauncher):
    """Validate the model and DataModule before any worker (and process group) starts.

    A bad layout then raises its own clear error in the user's process instead of a
    traceback relayed from a spawned worker.
    """

    def launch(self, function: Callable, *args: Any, trainer: Optional[Trainer] = None, **kwargs: Any) -> Any:
        module = next((a for a in args if isinstance(a, LightningModule)), None)
        datamodule = next((a for a in args if isinstance(a, LightningDataModule)), None)
        if trainer is not None and module is not None:
            self._strategy.check(trainer, module=module, datamodule=datamodule)
        return super().launch(function, *args, trainer=trainer, **kwargs)
