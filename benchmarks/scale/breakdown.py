"""Where a rank's memory goes: tensor bytes of what a GNNPipe / graph-parallel rank keeps, by kind.

Used by :class:`benchmarks.scale.worker.Probe` at the end of every training epoch of a 2-process run. Kinds (bytes, each
storage counted once):

* ``history`` and ``chunk_graph``: the strategy's own count (``WholeGraphStrategy.kept_bytes``, also logged as
  ``memory/history_bytes/rank<r>`` and ``memory/graph_bytes/rank<r>``);
* ``data``: the graph the DataModule holds (``x``, ``edge_index``, labels, masks; shared memory under spawn);
* ``parameters``: the module's parameters, gradients and optimizer state.

The rest of a rank's USS is the autograd graph (saved activations) at the step's peak, the pipeline's buffers,
allocator caches and the interpreter (torch, Lightning, PyG code).
"""

from __future__ import annotations

from typing import Dict

from torch import Tensor

from lightning_gnnpipe.data.chunk_graph import storage_bytes


def rank_breakdown(trainer) -> Dict[str, int]:
    """Tensor bytes this rank keeps, by kind (see the module docstring)."""
    params = list(trainer.lightning_module.parameters())
    state = [t for opt in trainer.optimizers for s in opt.state.values() for t in s.values() if isinstance(t, Tensor)]
    history, graph = trainer.strategy.kept_bytes()
    data = getattr(trainer.datamodule, "data", None)
    graph_tensors = [v for _, v in data if isinstance(v, Tensor)] if data is not None else []
    return {"parameters": storage_bytes(params + [p.grad for p in params] + state), "history": history,
            "chunk_graph": graph, "data": storage_bytes(graph_tensors)}
