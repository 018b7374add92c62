"""Let the user's unchanged ``*_step`` code see the pipeline's full-graph output.

While a step runs, the layer stack's ``forward`` is swapped for one that returns the logits
``(|V|, C)`` the pipeline computed; it is restored as soon as the step returns.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import Tensor, nn

from lightning_gnnpipe.nn.forward_swap import swapped_forward


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    return isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape and torch.equal(a, b)


@contextmanager
def stack_returns(stack: nn.Module, logits: Tensor, batch: Any) -> Iterator[None]:
    """Make ``stack(x, edge_index)`` return ``logits`` while the context is open.

    Raises:
        RuntimeError: (inside the context) if the stack is called with other features or
            edges than the batch's ``x`` and ``edge_index``: the pipeline computed its output
            from those.
    """

    def forward(x: Tensor, edge_index: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if not _same(x, getattr(batch, "x", None)) or not _same(edge_index, getattr(batch, "edge_index", None)):
            raise RuntimeError(
                f"GNNPipeStrategy: {type(stack).__name__} was called with other inputs than `batch.x` and "
                f"`batch.edge_index` (got x of shape {tuple(x.shape)}). The pipeline feeds the batch's own "
                "features to the first stage; move feature preprocessing into the DataModule or a block."
            )
        extra = [a for a in args if a is not None] + [v for v in kwargs.values() if v is not None]
        if extra:
            raise RuntimeError(
                f"GNNPipeStrategy: {type(stack).__name__} was called with extra inputs (got {len(extra)}, e.g. "
                "edge weights or attributes), which the pipeline does not carry. Call it as `(x, edge_index)`."
            )
        return logits

    with swapped_forward([(stack, forward)]):  # an instance forward the user set is put back afterwards
        yield
