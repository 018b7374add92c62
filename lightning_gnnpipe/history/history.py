"""Historical embeddings: one table of every node's input embedding for one layer.

GNNPipe (arXiv 2308.10087, Sec. 4.2) reads a chunk's halo rows from such a table: *fresh* if
the halo's chunk already passed this layer in the current epoch, *historical* (written in the
previous epoch) otherwise. The push/pull names follow GNNAutoScale's ``History``
(Fey et al., ICML 2021, arXiv 2106.05609).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class History(nn.Module):
    """Table of ``|V|`` rows of width ``channels``, zero until written.

    The table is a non-persistent buffer: it is not part of any ``state_dict`` and never
    requires grad; rows are copied in (``push``) and out (``pull``), so autograd never sees
    the in-place writes.

    Args:
        num_nodes: Rows ``|V|``.
        channels: Width ``d`` of the layer's input embedding.
        device: Device of the table (default: torch's default).
        dtype: Dtype of the table (default: torch's default).
        momentum: Moving-average weight ``m`` of the old rows in :meth:`push`, in ``[0, 1)``
            (0: plain overwrite).

    Raises:
        ValueError: If ``momentum`` is not in ``[0, 1)``.

    Shapes:
        ``emb``: ``(|V|, d)``.
    """

    def __init__(self, num_nodes: int, channels: int, device=None, dtype=None, momentum: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"History: `momentum` must be in [0, 1) (got {momentum}). Use 0 for plain tables.")
        self.momentum = momentum
        self.register_buffer("emb", torch.zeros(num_nodes, channels, device=device, dtype=dtype), persistent=False)

    @torch.no_grad()
    def push(self, index: Tensor, value: Tensor) -> None:
        """Write rows ``index`` ``(n,)`` with ``value`` ``(n, d)`` (detached).

        With ``momentum`` ``m > 0`` the rows become ``m * old + (1 - m) * value``: a moving average that
        smooths historical embeddings across epochs (PipeGCN, Wan et al., ICLR 2022, arXiv 2203.10428).
        """
        value = value.detach().to(self.emb.dtype)
        if self.momentum > 0:
            value = self.momentum * self.emb[index] + (1.0 - self.momentum) * value
        self.emb[index] = value

    def pull(self, index: Tensor) -> Tensor:
        """Return a detached copy of rows ``index`` ``(n,)`` as ``(n, d)``."""
        return self.emb[index]

    @torch.no_grad()
    def refresh(self, value: Tensor) -> float:
        """Overwrite all rows with exact embeddings ``(|V|, d)``; return the drift before it.

        Drift is ``||old - value|| / ||value||`` (Frobenius norms, unitless): how far the table had moved
        from the exact embeddings of the current weights.
        """
        norm = float(value.norm())
        drift = float((self.emb - value).norm()) / norm if norm > 0 else 0.0
        self.emb.copy_(value)
        return drift

    @torch.no_grad()
    def reset(self) -> None:
        """Zero the table."""
        self.emb.zero_()
