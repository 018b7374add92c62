"""Assign consecutive layers to stages."""

from __future__ import annotations

from typing import List


def split_layers(num_layers: int, num_stages: int) -> List[List[int]]:
    """Cut ``num_layers`` layers into ``num_stages`` runs of consecutive layers, balanced by count.

    The first ``num_layers % num_stages`` stages get one layer more.

    Args:
        num_layers: ``L``.
        num_stages: ``S``.

    Returns:
        ``S`` lists of layer indices, in order, together ``0 .. L-1``.

    Raises:
        ValueError: If ``S < 1`` or ``S > L`` (a stage would be empty).
    """
    if num_stages < 1 or num_stages > num_layers:
        raise ValueError(
            f"split_layers: cannot place {num_layers} layers on {num_stages} stages; every stage needs at "
            f"least one layer (got num_stages={num_stages}). Use between 1 and {num_layers} stages."
        )
    base, extra = divmod(num_layers, num_stages)
    out, start = [], 0
    for s in range(num_stages):
        size = base + (1 if s < extra else 0)
        out.append(list(range(start, start + size)))
        start += size
    return out
