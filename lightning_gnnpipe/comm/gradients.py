"""Summing weight gradients over graph-parallel ranks (each rank holds the gradient of its partition).

Graph parallelism and each stage of hybrid parallelism train the same weights on ``G`` partitions: the
full-graph gradient is the sum of the partitions' gradients, one ``all_reduce`` of one flat buffer
(as ``torch.nn.parallel.DistributedDataParallel`` buckets do).
"""

from __future__ import annotations

from typing import List

import torch
import torch.distributed as dist
from torch import nn

from lightning_gnnpipe.comm.accounting import CommStats


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
    offset, has = 0, flat[-len(params):]
    for i, p in enumerate(params):
        if bool(has[i] > 0):
            p.grad = flat[offset: offset + p.numel()].view_as(p).clone()
        offset += p.numel()
