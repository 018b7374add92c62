"""Mixed precision across stage boundaries, and gradient clipping by the global norm.

Mixed precision. Under ``precision="bf16-mixed"`` Lightning runs every step inside
``torch.autocast`` (``MixedPrecision``, Lightning 2.6). Parameters, history tables and the
optimizer stay in float32; what autocast computes in bfloat16 depends on the ops (a PyG
``GCNConv`` returns float32 because its float32 edge weights promote the aggregation, a
``Linear`` returns bfloat16). The pipeline's P2P buffers are allocated once, before any step, so
the dtype crossing a boundary must be fixed up front, not left to autocast:

* activations and their gradients between stages travel in the **autocast dtype** (bfloat16):
  half the bytes of float32. A stage casts what it sends to bfloat16 and what it receives back
  to the data dtype (float32) before its own layers run, so history tables, halos and
  non-autocast ops see the same dtype as without a pipeline. The only extra rounding is of the
  boundary activations, which the next layer's matmul rounds to bfloat16 under autocast anyway;
* the last stage's output (the logits the user's loss sees) stays in the data dtype.

Without autocast (``"32-true"``) every boundary dtype is the data dtype and nothing is cast.
``"16-mixed"`` is refused: its gradient scaler scales the loss given to ``backward``, but the
pipeline's backward runs inside the schedule, so the scaler would unscale gradients it never
scaled. Lower-precision weights (``"bf16-true"``, ``"16-true"``) and ``"64-true"`` are refused too.

Clipping. Lightning clips in ``Precision.clip_grad_by_norm`` with the parameters of this rank's
optimizer. Under GNNPipe a rank holds gradients only for its own stage's parameters, so the local
norm is one stage's norm; the global norm needs the sum of every stage's squared norm (an
all-reduce). :func:`global_norm_clipping` returns the strategy's precision plugin with that one
method replaced. Under graph parallelism the gradients are already summed over the ranks (equal
everywhere), so the local norm is the global one and no wrapper is installed.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch
import torch.distributed as dist
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from torch import Tensor
from torch.optim import Optimizer


def check_precision(plugin: Precision, where: str = "GNNPipeStrategy") -> None:
    """Accept ``"32-true"`` and ``"bf16-mixed"``; refuse every other precision.

    Raises:
        ValueError: Any other precision plugin (``"16-mixed"``, ``"bf16-true"``, ``"16-true"``,
            ``"64-true"``, quantisation plugins).
    """
    if _base_class(plugin) is Precision:
        return
    if isinstance(plugin, MixedPrecision) and plugin.precision == "bf16-mixed":
        return
    name = getattr(plugin, "precision", type(plugin).__name__)
    hint = " Its gradient scaler cannot reach the pipeline's backward." if name == "16-mixed" else ""
    raise ValueError(
        f"{where}: precision {name!r} is not supported (got {type(plugin).__name__}).{hint} "
        "Use precision='bf16-mixed' or '32-true'."
    )


def autocast_dtype(plugin: Precision) -> Optional[torch.dtype]:
    """The dtype autocast computes in under ``plugin`` (``None``: no autocast)."""
    if isinstance(plugin, MixedPrecision):
        return torch.bfloat16 if plugin.precision == "bf16-mixed" else torch.float16
    return None


# ---------------------------------------------------------------------- clipping
def global_grad_norm(grads: Sequence[Tensor], norm_type: float = 2.0, group: Any = None,
                     device: Optional[torch.device] = None) -> Tensor:
    """Return the ``norm_type``-norm of ``grads`` over every rank of ``group`` (a collective).

    Each rank passes the gradients it alone holds (a stage's); the result is the norm of their
    concatenation over all ranks, the same on every rank.

    Args:
        grads: This rank's gradients (may be empty).
        norm_type: ``p`` of the p-norm, ``inf`` for the max norm.
        group: Process group (default: world).
        device: Where to reduce when ``grads`` is empty (nccl needs the rank's GPU).
    """
    grads = list(grads)
    device = grads[0].device if grads else (device or torch.device("cpu"))
    local = torch.nn.utils.get_total_norm(grads, norm_type).to(device=device, dtype=torch.float32) if grads \
        else torch.zeros((), device=device)
    if norm_type == float("inf"):
        dist.all_reduce(local, op=dist.ReduceOp.MAX, group=group)
        return local
    power = local.pow(norm_type)
    dist.all_reduce(power, op=dist.ReduceOp.SUM, group=group)
    return power.pow(1.0 / norm_type)


class GlobalNormClipping:
    """Mixin over a Lightning precision plugin: ``clip_grad_by_norm`` uses the global norm.

    Used by the explicit plugins :class:`GlobalNormPrecision` and :class:`GlobalNormMixedPrecision`, built by
    :func:`global_norm_clipping`; the rest of the plugin is Lightning's own. Neither holds state (``state_dict()`` is
    ``{}``: ``"bf16-mixed"`` has no gradient scaler), and Lightning 2.6 writes a precision plugin's entry into a
    checkpoint only when that state is not empty, so a checkpoint holds no entry of theirs and reads as one written on
    a single device.
    """

    _clip_group: Any = None
    _clip_device: Optional[torch.device] = None

    def clip_grad_by_norm(self, optimizer: Optimizer, clip_val: Union[int, float]) -> None:
        params = [p for p in self.main_params(optimizer) if p.grad is not None]  # type: ignore[attr-defined]
        total = global_grad_norm([p.grad for p in params], 2.0, self._clip_group, self._clip_device)
        torch.nn.utils.clip_grads_with_norm_(params, clip_val, total)


class GlobalNormPrecision(GlobalNormClipping, Precision):
    """``"32-true"`` with global-norm clipping."""


class GlobalNormMixedPrecision(GlobalNormClipping, MixedPrecision):
    """``"bf16-mixed"`` with global-norm clipping."""


def global_norm_clipping(plugin: Precision, group: Any = None, device: Optional[torch.device] = None) -> Precision:
    """Return a new plugin like ``plugin`` whose norm clipping uses the global gradient norm.

    The result is a :class:`GlobalNormPrecision` or :class:`GlobalNormMixedPrecision` (subclasses of Lightning's
    ``Precision`` and ``MixedPrecision``, so ``isinstance`` checks still hold); the user's plugin object is not
    changed. A mixed-precision plugin's scaler is shared with the original.

    Args:
        plugin: The strategy's precision plugin (``"32-true"`` or ``"bf16-mixed"``, see :func:`check_precision`).
        group: Process group whose ranks hold disjoint parts of the gradients.
        device: This rank's device (for ranks without gradients).

    Raises:
        ValueError: Another precision plugin.
    """
    check_precision(plugin)
    if isinstance(plugin, MixedPrecision):
        wrapped: Precision = GlobalNormMixedPrecision(plugin.precision, plugin.device, plugin.scaler)
    else:
        wrapped = GlobalNormPrecision()
    wrapped._clip_group, wrapped._clip_device = group, device  # type: ignore[attr-defined]
    return wrapped


def _base_class(plugin: Precision) -> type:
    """The Lightning class of the plugin (under :class:`GlobalNormClipping` if wrapped)."""
    if isinstance(plugin, GlobalNormClipping):
        return MixedPrecision if isinstance(plugin, MixedPrecision) else Precision
    return type(plugin)
