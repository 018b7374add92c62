"""Dropout with one mask per node and epoch, the same in every chunk that reads the node.

With plain dropout (``F.dropout``, ``nn.Dropout``) on a layer's input, a chunk draws a new mask for every row it
holds, its halo rows included: a node read as a halo by several chunks is dropped differently in each of them and in
its own chunk, where full-graph training drops it once per layer. :class:`NodeDropout` instead derives the mask of
row ``v`` from ``(seed, epoch, v)`` with a counter-based hash, so the owner chunk and every chunk that reads ``v``
as a halo apply the same mask, as full-graph training does. The stage tells it the global id of each row and the
epoch (:func:`node_rows`); outside such a context it is plain dropout.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_ROWS: ContextVar[Optional[Tuple[Tensor, int]]] = ContextVar("lightning_gnnpipe_node_rows", default=None)
_M32 = 0xFFFFFFFF


@contextmanager
def node_rows(ids: Tensor, epoch: int) -> Iterator[None]:
    """Declare the global node id of each row of the tensors a block is called on, and the epoch.

    Args:
        ids: Global node id of each row ``(R,)``, int64.
        epoch: Training epoch; every epoch draws new masks.
    """
    token = _ROWS.set((ids, int(epoch)))
    try:
        yield
    finally:
        _ROWS.reset(token)


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer hash (two multiply-xorshift rounds) of an int64 tensor holding 32-bit values."""
    x = ((x >> 16) ^ x) * 0x45D9F3B & _M32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _M32
    return (x >> 16) ^ x


def node_mask(ids: Tensor, width: int, p: float, seed: int, epoch: int) -> Tensor:
    """Return the keep mask of rows ``ids`` ``(R, width)``, bool: a function of ``(seed, epoch, id, column)`` only.

    Each entry is kept with probability ``1 - p`` (a uniform 32-bit hash compared with ``p``).
    """
    salt = int(_mix32(torch.tensor([(seed * 0x9E3779B1 + epoch * 0x85EBCA77) & _M32]))[0])
    row = _mix32((ids.to(torch.int64) & _M32) ^ salt)
    cols = torch.arange(width, device=ids.device, dtype=torch.int64)
    u = _mix32((row[:, None] + cols * 0x27D4EB2F) & _M32 ^ (salt >> 1))
    return u >= int(p * 2**32)


class NodeDropout(nn.Module):
    """Dropout whose mask depends on the node, not on the chunk that holds its row.

    Use it instead of ``nn.Dropout`` / ``F.dropout`` on a layer's input (before the message passing) so that a
    node's halo row is dropped exactly as its own row is: under :class:`~lightning_gnnpipe.GNNPipeStrategy` the
    stage declares every row's global node id and the epoch (:func:`node_rows`), and the mask of row ``v`` is a
    hash of ``(seed, epoch, v, column)``. Outside that context (single-device training, evaluation code of your
    own) it is ``F.dropout``. In evaluation mode it is the identity.

    Args:
        p: Probability of zeroing an entry, in ``[0, 1)``.
        seed: Seed of the masks; ``None`` draws one from the global RNG at construction, so that
            ``seed_everything`` gives every rank the same masks.

    Shapes:
        ``x`` ``(R, d)`` -> ``(R, d)``.

    Raises:
        ValueError: ``p`` outside ``[0, 1)``; in forward, under :func:`node_rows`, an input that is not
            ``(R, d)`` with one row per declared node.
    """

    def __init__(self, p: float = 0.5, seed: Optional[int] = None) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"NodeDropout: `p` must be in [0, 1) (got {p}).")
        self.p = float(p)
        self.seed = int(torch.randint(0, 2**31 - 1, ())) if seed is None else int(seed)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        rows = _ROWS.get()
        if rows is None:
            return F.dropout(x, self.p, True)
        ids, epoch = rows
        if x.dim() != 2 or x.size(0) != ids.numel():
            raise ValueError(f"NodeDropout: expected one row per node of the block's input, shape ({ids.numel()}, d) "
                             f"(got {tuple(x.shape)}). Apply it to node embeddings, not to edge or head tensors.")
        keep = node_mask(ids.to(x.device), x.size(-1), self.p, self.seed, epoch)
        return x * keep.to(x.dtype) / (1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}, seed={self.seed}"
