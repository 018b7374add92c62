"""Swap the ``forward`` of modules for a block of code, then put back exactly what was there.

The package runs a user's unchanged modules in other ways for a while: a conv on a chunk's kernels
(:mod:`~lightning_gnnpipe.nn.sparse`, :mod:`~lightning_gnnpipe.nn.gcn_norm`) or a layer stack that returns the
pipeline's logits to the user's ``training_step`` (:mod:`~lightning_gnnpipe.strategy.forward_patch`). Each sets an
instance attribute ``forward`` (which ``nn.Module.__call__`` reads before the class's) and, when the block ends,
restores the instance ``forward`` the module had before (one a user or another swap set), or removes its own.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Tuple

from torch import nn


def current_forward(module: nn.Module) -> Callable:
    """The ``forward`` a call of ``module`` runs now: its instance attribute if set, else the class's, bound."""
    own = module.__dict__.get("forward")
    return own if own is not None else type(module).forward.__get__(module)


@contextmanager
def swapped_forward(swaps: Iterable[Tuple[nn.Module, Callable]]) -> Iterator[None]:
    """Run the block with each ``module.forward`` replaced by its callable; restore every one afterwards (also on
    error), the last swapped first."""
    saved = []
    try:
        for module, forward in swaps:
            saved.append((module, module.__dict__.get("forward")))
            module.forward = forward
        yield
    finally:
        for module, prior in reversed(saved):
            if prior is None:
                del module.forward
            else:
                module.forward = prior
