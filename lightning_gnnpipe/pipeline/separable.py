"""Whether the user's full-graph loss lets 1F1B drive the pipeline: a row-separability probe.

Schedules that interleave backwards with forwards (1F1B and the multi-stage ones) need ``dL/d(out_c)`` right after
chunk ``c``'s forward, before the later chunks' rows exist. The user's ``training_step`` computes ``L`` from the whole
graph's output ``(|V|, C)``. For the usual node-level losses (a mean or sum of per-node terms over masked nodes,
``F.cross_entropy(out[mask], y[mask])``) the gradient on chunk ``c``'s rows depends on those rows only, so the
loss can be evaluated on a full output whose other rows are placeholders
(:class:`~lightning_gnnpipe.pipeline.loss.PipelineLoss`, mode ``"separable"``) and gives the exact gradient.

:func:`probe_row_separable` checks that property once, at setup, by perturbation: the gradient on a chunk's rows must
not change when every other row changes. Losses that mix rows (a softmax over nodes, a contrastive term between
nodes, a norm over the whole output) fail it and keep GPipe, which evaluates the loss once on the finished output.
The probe evaluates the loss on random outputs, so a loss whose coupling of rows depends on the values in a way
random normal outputs do not reach could pass it; ``pipeline_chunk_loss`` (docs/quickstart.md) states the
decomposition explicitly instead.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import torch
from torch import Tensor

LossOf = Callable[[Tensor], Tensor]
"""``loss_of(full)``: the user's loss (a scalar tensor) computed from a full-graph output ``full`` ``(|V|, C)``."""

RTOL = 1e-5  # relative tolerance of the probe; a separable loss gives identical gradients (seen: bitwise)


def _grad_on(loss_of: LossOf, full: Tensor) -> Tensor:
    full = full.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = loss_of(full)
        if not isinstance(loss, Tensor) or not loss.requires_grad:
            raise RuntimeError(
                "GNNPipeStrategy: `training_step` returned a loss that does not depend on the model output (got "
                f"{type(loss).__name__}). Return the loss computed from `self(x, edge_index)`.")
        (grad,) = torch.autograd.grad(loss, full, allow_unused=True)
    return torch.zeros_like(full) if grad is None else grad


def probe_row_separable(loss_of: LossOf, num_nodes: int, num_classes: int, chunk_nodes: Sequence[Tensor],
                        dtype: torch.dtype = torch.float32, device: Optional[torch.device] = None,
                        seed: int = 0) -> Optional[str]:
    """Check that the loss's gradient on a chunk's rows does not depend on the other rows.

    Evaluates ``loss_of`` three times on random outputs: once on ``A`` and, for the first and the last chunk, once on
    ``A`` with every row outside the chunk replaced by other random values. Deterministic (its own generator).

    Args:
        loss_of: The user's loss as a function of the full-graph output.
        num_nodes: ``|V|``.
        num_classes: ``C``, the model's output width.
        chunk_nodes: Global node ids of each chunk (``K`` tensors).
        dtype: Dtype of the outputs the loss will see.
        device: Where the outputs live (default: the chunk ids' device).
        seed: Seed of the random outputs.

    Returns:
        ``None`` if the gradient on each probed chunk's rows is unchanged (relative tolerance ``1e-5`` of the largest
        gradient entry), else one sentence saying which chunk's gradient changed and by how much.

    Raises:
        RuntimeError: The loss does not depend on the output.

    Shapes:
        ``loss_of`` receives ``(|V|, C)``.
    """
    device = device if device is not None else chunk_nodes[0].device
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(num_nodes, num_classes, generator=gen).to(device=device, dtype=dtype)
    reference = _grad_on(loss_of, base)
    scale = float(reference.abs().max()) or 1.0
    probed: List[int] = sorted({0, len(chunk_nodes) - 1})
    for c in probed:
        rows = chunk_nodes[c].to(device)
        other = torch.randn(num_nodes, num_classes, generator=gen).to(device=device, dtype=dtype)
        other[rows] = base[rows]
        diff = float((_grad_on(loss_of, other)[rows] - reference[rows]).abs().max())
        if diff > RTOL * scale:
            return (f"the gradient of the `training_step` loss on chunk {c}'s rows changed by {diff:.3g} (largest "
                    f"gradient entry {scale:.3g}) when the other rows changed, so the loss mixes nodes' outputs")
    return None


def rows_outside(loss_of: LossOf, num_nodes: int, num_classes: int, rows: Tensor, dtype: torch.dtype = torch.float32,
                 device: Optional[torch.device] = None, seed: int = 0) -> int:
    """How many rows outside ``rows`` ``(n,)`` the loss's gradient reaches, on one random output ``(|V|, C)``.

    With several steps an epoch only a step's chunks have output rows (the others are zero): a loss that reads other
    rows would train differently from one device. Deterministic (its own generator). Raises ``RuntimeError`` if the
    loss does not depend on the output.
    """
    device = device if device is not None else rows.device
    gen = torch.Generator().manual_seed(seed)
    grad = _grad_on(loss_of, torch.randn(num_nodes, num_classes, generator=gen).to(device=device, dtype=dtype))
    reached = grad.abs().sum(1) > 0
    reached[rows.to(device)] = False
    return int(reached.sum())
