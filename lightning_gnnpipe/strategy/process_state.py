"""What a rank's fit changes in its own process, and how ``teardown`` gives it back.

The strategies change a few process-wide settings while they fit. Each is scoped to the fit: it is registered, with how
to undo it, on the strategy's ``ExitStack`` when it is made, and ``teardown`` closes the stack (newest first).

* ``setup_environment`` adds a ``warnings`` filter that ignores Lightning's advice to log epoch metrics with
  ``sync_dist=True`` (:func:`quiet_sync_dist_advice`); ``teardown`` removes that entry, other filters (the user's
  included) stay as they are.
* ``setup`` points every torchmetrics ``Metric`` of the module at a group of this rank alone (every rank sees the
  whole graph); ``teardown`` gives each metric its own ``process_group`` back.
* ``setup_environment`` sets ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` for an NCCL backend unless it is set
  (:mod:`~lightning_gnnpipe.strategy.failures`); ``teardown`` removes it again.
* glibc's mmap threshold (``heap_mmap_threshold``) cannot be undone, so it is fixed only in processes the strategies'
  launchers start; ``THP_MEM_ALLOC_ENABLE`` and the launchers' mark live in the environment only while they launch
  (popen: until rank 0's fit starts). See :mod:`~lightning_gnnpipe.strategy.allocator`.
* The row ids of :class:`~lightning_gnnpipe.nn.NodeDropout` (a ``ContextVar``) are set for one block call at a time by
  :func:`~lightning_gnnpipe.nn.node_rows`, a context manager that resets them on return and on error.
"""

from __future__ import annotations

import warnings
from typing import Callable

from lightning.fabric.utilities.warnings import PossibleUserWarning

SYNC_DIST_ADVICE = r"It is recommended to use `self\.log\(.*sync_dist=True\)`"
"""The message of Lightning's advice (``PossibleUserWarning``, Lightning 2.6), as a ``warnings`` filter pattern."""


def quiet_sync_dist_advice() -> Callable[[], None]:
    """Ignore Lightning's advice to log epoch metrics with ``sync_dist=True`` in this process; return the undo.

    Under the strategies every rank logs the single-device values (one data-parallel replica), so ``sync_dist=True``
    would change nothing. The undo removes the one entry this call added from ``warnings.filters`` (Python's
    documented list of filters); if an equal entry was there already, nothing is added and nothing removed.
    """
    before = list(warnings.filters)
    warnings.filterwarnings("ignore", message=SYNC_DIST_ADVICE, category=PossibleUserWarning)
    entry = warnings.filters[0]
    if entry in before:  # there already (moved to the front by filterwarnings): keep the order it had
        warnings.filters[:] = before
        return lambda: None

    def undo() -> None:
        if entry in warnings.filters:
            warnings.filters.remove(entry)

    return undo
