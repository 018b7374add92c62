"""The initial embedding ``x0`` on the later stages: computed there from the node features, not sent.

A GCNII layer (arXiv 2007.02133) mixes in ``x0``, block 0's output. Sent beside each chunk's rows, ``x0`` doubles
what crosses a stage boundary: ``|V| d_0`` values forward and as many gradients backward per boundary and epoch,
on top of the ``|V| d`` each way of the chunk's own rows. When block 0 is node-wise (no message passing: GCNII's input
linear layer) and deterministic in training (the same rows give the same output twice: no ``nn.Dropout`` draw;
:class:`~lightning_gnnpipe.nn.NodeDropout` is keyed by node and epoch, so it qualifies), every later stage computes
``x0`` of its chunk's rows itself with its rank's copy of block 0, from the features (which such a rank then keeps,
``|V| x F``). What crosses instead, once per step: block 0's weights and buffers, broadcast from the rank that owns
block 0 before each forward pass that uses them, and the gradients of its parameters that the later stages computed,
summed into the owner's before the optimizer step (the other ranks' are dropped, so only the owner steps them, as it
steps its own layers). With one graph partition only: hybrid parallelism keeps sending ``x0``.
"""

from __future__ import annotations

import copy
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lightning_gnnpipe.comm.accounting import CommStats
from lightning_gnnpipe.nn.dropout import node_rows
from lightning_gnnpipe.nn.stack import takes_x0, uses_graph

PROBE_ROWS = 64
"""Rows of the features block 0 runs on twice to tell whether it draws random numbers in training."""


def deterministic_in_training(block: nn.Module, x: Tensor) -> bool:
    """Whether ``block`` (node-wise) gives the same output twice in training mode on the first rows of ``x``.

    A copy of the block runs, under a forked RNG, so that neither the block's buffers (running statistics) nor the
    random number streams of this process change.

    Shapes:
        ``x``: ``(|V|, F)``; at most :data:`PROBE_ROWS` of its rows are used.
    """
    probe = copy.deepcopy(block).train()
    rows = x[:PROBE_ROWS]
    ids = torch.arange(rows.size(0), device=rows.device)
    no_edges = ids.new_zeros(2, 0)
    devices = [rows.device] if rows.is_cuda else []
    with torch.no_grad(), torch.random.fork_rng(devices=devices), node_rows(ids, 0):
        first, second = probe(rows, no_edges), probe(rows, no_edges)
    return torch.equal(first, second)


def recomputes_x0(blocks: List[nn.Module], x: Tensor, num_stages: int, graph_parallel_size: int = 1) -> bool:
    """Whether the later stages compute ``x0`` themselves (module docstring): some block takes ``x0``, there are
    at least two stages, one graph partition, and block 0 is node-wise and deterministic in training."""
    if num_stages < 2 or graph_parallel_size != 1 or not any(takes_x0(b) for b in blocks):
        return False
    return not uses_graph(blocks[0]) and deterministic_in_training(blocks[0], x)


class InitialEmbeddingSync:
    """Block 0's weights and gradients between its owner and the ranks whose stages compute ``x0`` with a copy.

    Every rank of the pipeline calls both methods (collectives over ``group``).

    Args:
        block: Block 0 on this rank (the owner's own, or this rank's copy).
        owner: The owner's rank within ``group`` (the position of stage 0).
        position: This rank's rank within ``group``.
        group: The pipeline's process group.
        stats: Where the bytes are counted (kind ``"weight_allreduce"``).
    """

    def __init__(self, block: nn.Module, owner: int, position: int, group: Optional[object],
                 stats: CommStats) -> None:
        self.block, self.owner, self.position, self.group, self.stats = block, owner, position, group, stats
        self.params = [p for p in block.parameters() if p.requires_grad]
        self.world = dist.get_world_size(group)

    @torch.no_grad()
    def weights(self) -> None:
        """Overwrite every rank's copy of block 0 (parameters and buffers) with the owner's: one broadcast per
        dtype, the tensors flattened into one buffer."""
        by_dtype: Dict[torch.dtype, List[Tensor]] = {}
        for t in list(self.block.parameters()) + list(self.block.buffers()):
            by_dtype.setdefault(t.dtype, []).append(t.data)
        for dtype in sorted(by_dtype, key=str):  # the same order on every rank
            tensors = by_dtype[dtype]
            flat = torch.cat([t.reshape(-1) for t in tensors])
            dist.broadcast(flat, src=self._owner_rank, group=self.group)
            self.stats.record_broadcast("weight_allreduce", flat, self.owner, self.position, self.world)
            if self.position != self.owner:
                for t, v in zip(tensors, flat.split([t.numel() for t in tensors])):
                    t.copy_(v.view_as(t))

    @property
    def _owner_rank(self) -> int:
        return dist.get_global_rank(self.group, self.owner) if self.group is not None else self.owner

    def gradients(self) -> None:
        """Sum block 0's parameter gradients of every rank into the owner's; drop them elsewhere."""
        if not self.params:
            return
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params])
        dist.reduce(flat, dst=self._owner_rank, group=self.group)
        if self.position != self.owner:
            self.stats.record("weight_allreduce", sent=flat.numel() * flat.element_size())
            for p in self.params:
                p.grad = None
            return
        self.stats.record("weight_allreduce", recv=(self.world - 1) * flat.numel() * flat.element_size())
        for p, g in zip(self.params, flat.split([p.numel() for p in self.params])):
            p.grad = g.view_as(p).clone() if p.grad is None else p.grad.copy_(g.view_as(p))
