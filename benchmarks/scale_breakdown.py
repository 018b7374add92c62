"""Where a rank's memory goes: tensor bytes of what a GNNPipe / graph-parallel rank keeps, by kind.

Used by :class:`scale_worker.Probe` at the end of every training epoch of a 2-process run. Each tensor is counted
once (by storage), sparse CSR tensors by their index and value arrays. Kinds:

* ``history``: the history tables (``History.emb``) and halo-gradient tables;
* ``chunk_graph``: the chunk graphs (node / halo ids, local edge lists, CSR structures and operators, row ids);
* ``data``: the graph the DataModule holds (``x``, ``edge_index``, labels, masks; shared memory under spawn);
* ``parameters``: the module's parameters, gradients and optimizer state.

The rest of a rank's USS is the autograd graph (saved activations) at the step's peak, allocator caches and the
interpreter (torch, Lightning, PyG code).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, Set

import torch
from torch import Tensor, nn


def _storages(t: Tensor) -> Iterable[Tensor]:
    if t.layout == torch.sparse_csr:
        return [t.crow_indices(), t.col_indices(), t.values()]
    if t.is_sparse:
        return [t._indices(), t._values()]
    return [t]


def tensor_bytes(obj, seen: Set[int], depth: int = 0) -> int:
    """Bytes of the tensors reachable from ``obj`` (lists, dicts, dataclasses, modules, plain objects) not in
    ``seen`` (storage pointers, updated)."""
    if depth > 12 or obj is None or isinstance(obj, (int, float, str, bool, torch.dtype, torch.device)):
        return 0
    total = 0
    if isinstance(obj, Tensor):
        for s in _storages(obj):
            key = s.untyped_storage().data_ptr()
            if key and key not in seen:
                seen.add(key)
                total += s.untyped_storage().nbytes()
        return total
    if isinstance(obj, nn.Module):
        items = list(obj._buffers.values()) + list(obj._parameters.values()) + list(obj._modules.values())
        items += [v for k, v in vars(obj).items() if not k.startswith("_")]
    elif isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple, set)):
        items = list(obj)
    elif dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__"):
        items = list(vars(obj).values())
    else:
        return 0
    for item in items:
        total += tensor_bytes(item, seen, depth + 1)
    return total


def rank_breakdown(trainer) -> Dict[str, int]:
    """Tensor bytes this rank keeps, by kind (see the module docstring)."""
    seen: Set[int] = set()
    out: Dict[str, int] = {}
    module = trainer.lightning_module
    params = list(module.parameters())
    out["parameters"] = tensor_bytes(params + [p.grad for p in params], seen)
    out["parameters"] += sum(tensor_bytes(opt.state_dict()["state"], seen) for opt in trainer.optimizers)
    runtime = getattr(trainer.strategy, "_runtime", None)
    if runtime is not None:
        out["history"] = tensor_bytes([list(st.histories.values()) + list(st.halo_grads.values())
                                       for st in runtime.stages], seen)
        out["chunk_graph"] = tensor_bytes([[st.graph, st._rows, st._callers] for st in runtime.stages], seen)
    else:  # graph parallelism: everything the strategy holds
        out["strategy"] = tensor_bytes(vars(trainer.strategy), seen)
    dm = trainer.datamodule
    out["data"] = tensor_bytes(getattr(dm, "data", None), seen)
    return out
