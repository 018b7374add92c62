"""Stale halo gradients: gradients that reach a halo row are applied to its owner one epoch later.

With detached halos (GNNAutoScale, Fey et al., ICML 2021) the gradient of the loss with respect to a chunk's halo
rows is dropped. PipeGCN (Wan et al., ICLR 2022, arXiv 2203.10428) keeps it and applies it one iteration late:
here, the gradients that reach halo rows of layer ``l`` during epoch ``e`` are summed per node, and in epoch
``e + 1`` they are added to the gradient of the owner chunk's input of layer ``l`` during its backward.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


HALO_GRADIENTS = ("detach", "stale")
"""What a halo row's gradient does: ``"detach"`` (dropped, GNNPipe's default) or ``"stale"`` (applied to its owner
one epoch later, :class:`HaloGradients`)."""


def check_halo_gradients(value: object, owner: str) -> None:
    """Check a ``halo_gradients`` option before any process group starts.

    Raises:
        ValueError: ``value`` is not one of :data:`HALO_GRADIENTS` (the message names ``owner`` and the value).
    """
    if value not in HALO_GRADIENTS:
        raise ValueError(f"{owner}: `halo_gradients` must be 'detach' or 'stale' (got {value!r}).")


class _AddToGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, extra: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(extra)
        return h.view_as(h)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (extra,) = ctx.saved_tensors
        return grad + extra.to(grad.dtype), None


class HaloGradients(nn.Module):
    """Per-node gradient tables of one layer's input: collected this epoch, applied next epoch.

    Shapes:
        ``collected``, ``applied``: ``(|V|, d)``.
    """

    def __init__(self, num_nodes: int, channels: int, device=None) -> None:
        super().__init__()
        self.register_buffer("collected", torch.zeros(num_nodes, channels, device=device), persistent=False)
        self.register_buffer("applied", torch.zeros(num_nodes, channels, device=device), persistent=False)

    def collect(self, halo_rows: Tensor, index: Tensor) -> Tensor:
        """Return ``halo_rows`` ``(h, d)`` made differentiable; their gradient is summed into row ``index``."""
        halo_rows = halo_rows.detach().requires_grad_(True)

        def hook(grad: Tensor) -> None:
            self.collected.index_add_(0, index, grad.to(self.collected.dtype))

        halo_rows.register_hook(hook)
        return halo_rows

    def apply(self, h: Tensor, index: Tensor) -> Tensor:
        """Return ``h`` ``(n, d)`` whose backward also carries last epoch's gradient of rows ``index``."""
        return _AddToGrad.apply(h, self.applied[index])

    @torch.no_grad()
    def next_epoch(self) -> None:
        """Make this epoch's collected gradients the ones applied in the next epoch."""
        self.applied.copy_(self.collected)
        self.collected.zero_()
