"""Weights and optimizer state across stages.

Every rank holds the whole LightningModule, but only the stage that owns a layer trains it.
Before a checkpoint is written, and at the end of fit, every owned tensor is broadcast from
its owner, so rank 0 holds the complete model under the original parameter names; such a
checkpoint loads with ``strict=True`` into the unsplit module. Optimizer states are merged
the same way: each parameter's state comes from its owner, so the result is an ordinary
single-device optimizer ``state_dict``.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.optim import Optimizer


def tensor_owners(blocks: List[nn.Module], layers_per_stage: List[List[int]]) -> Dict[int, int]:
    """Map ``id(tensor)`` of every parameter and buffer of the blocks to its owning stage."""
    owners: Dict[int, int] = {}
    for stage, layers in enumerate(layers_per_stage):
        for layer in layers:
            for t in list(blocks[layer].parameters()) + list(blocks[layer].buffers()):
                owners.setdefault(id(t), stage)
    return owners


@torch.no_grad()
def sync_stage_tensors(module: nn.Module, owners: Dict[int, int], group=None) -> None:
    """Overwrite, on every rank, each owned parameter and buffer with its owner's values: one broadcast per owner and
    dtype (the tensors flattened into one buffer, of the owner's tensors' bytes), in the same order on every rank.

    Args:
        module: The whole user module, the same on every rank.
        owners: ``id(tensor)`` to the rank in ``group`` that trains it (:func:`tensor_owners`); others are left alone.
        group: The ranks that share the module's stages (``None``: the world). A collective: every rank of ``group``
            must call it, and fails with the group's timeout if one does not.
    """
    seen, batches = set(), {}
    for _, t in sorted(
        list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False)),
        key=lambda kv: kv[0],
    ):
        if id(t) in owners and id(t) not in seen:
            seen.add(id(t))
            batches.setdefault((owners[id(t)], str(t.dtype), str(t.device)), []).append(t.data)
    me = dist.get_rank(group) if group is not None else dist.get_rank()
    for (owner, _, _), tensors in sorted(batches.items(), key=lambda kv: kv[0]):
        src = dist.get_global_rank(group, owner) if group is not None else owner
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.broadcast(flat, src=src, group=group)
        if me != owner:
            for t, v in zip(tensors, flat.split([t.numel() for t in tensors])):
                t.copy_(v.view_as(t))


def merged_optimizer_state(optimizer: Optimizer, owners: Dict[int, int], rank: int, group=None) -> Dict[str, Any]:
    """Gather every rank's optimizer state and keep, per parameter, its owner's entry.

    Returns:
        A ``state_dict`` of the same optimizer as on a single device.
    """
    index_owner = {}
    i = 0
    for g in optimizer.param_groups:
        for p in g["params"]:
            index_owner[i] = owners.get(id(p), 0)
            i += 1
    state = optimizer.state_dict()
    mine = {k: v for k, v in state["state"].items() if index_owner.get(k, 0) == rank}
    gathered: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, {k: _to_cpu(v) for k, v in mine.items()}, group=group)
    merged: Dict[Any, Any] = {}
    for part in gathered:
        merged.update(part)
    return {"state": dict(sorted(merged.items())), "param_groups": state["param_groups"]}


def _to_cpu(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value
