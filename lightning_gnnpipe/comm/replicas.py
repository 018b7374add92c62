"""The ``G`` replicas of a layer under graph and hybrid parallelism: same start weights, summed gradients.

Graph parallelism and each stage of hybrid parallelism train the same weights on ``G`` partitions. Every replica
starts from one rank's weights (:func:`broadcast_blocks`, as DDP does at construction), and the full-graph
gradient is the sum of the partitions' gradients, one ``all_reduce`` of one flat buffer
(:func:`all_reduce_grads`, as ``torch.nn.parallel.DistributedDataParallel`` buckets do).
"""

from __future__ import annotations

from typing import List

import torch
import torch.distributed as dist
from torch import nn

from lightning_gnnpipe.comm.accounting import CommStats


@torch.no_grad()
def broadcast_blocks(blocks: List[nn.Module], src: int, group=None) -> None:
    """Overwrite every parameter and buffer of ``blocks`` with rank ``src``'s values, as DDP does at construction.

    Args:
        blocks: Modules whose tensors are overwritten in place (a tensor shared by several is sent once).
        src: Global rank whose values every rank of ``group`` takes.
        group: Process group (default: the world).
    """
    for t in dict.fromkeys(t for b in blocks for t in list(b.parameters()) + list(b.buffers())):
        dist.broadcast(t.data, src=src, group=group)


def all_reduce_grads(params: List[nn.Parameter], stats: CommStats, world: int, group=None) -> None:
    """Sum every parameter's gradient over the ranks of ``group`` in place.

    A parameter without gradient on some rank counts as zero there; it keeps ``grad = None`` only if it has
    none on every rank. Bytes are recorded as ``weight_allreduce`` (ring all-reduce: ``2 (G-1)/G`` of the
    buffer sent and received per rank).

    Args:
        params: The same parameters, in the same order, on every rank of ``group``.
        stats: Where to count the bytes and the wait.
        world: ``G``, ranks in ``group``.
        group: Process group (default: world).
    """
    if not params:
        return
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
                     + [torch.tensor([float(p.grad is not None) for p in params], dtype=params[0].dtype,
                                     device=params[0].device)])
    with stats.waiting():
        dist.all_reduce(flat, group=group)
    stats.record_all_reduce("weight_allreduce", flat, world)
    offset, has = 0, flat[-len(params):].tolist()  # one host read per step
    for i, p in enumerate(params):
        if has[i] > 0:
            p.grad = flat[offset: offset + p.numel()].view_as(p).clone()
        offset += p.numel()
