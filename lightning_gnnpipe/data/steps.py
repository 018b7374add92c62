"""Several optimizer steps an epoch: which chunks form each step's group, and the loader that serves the groups.

GNNPipe's own training takes one optimizer step an epoch, every chunk's gradient summed (full-graph semantics;
arXiv 2308.10087, Sec. 4). With ``chunks_per_step = c < K`` an epoch is ``K / c`` steps, each a *group* of ``c``
chunks pipelined through the stages and followed by one optimizer step. That is GNNAutoScale's mini-batch rule
(Fey et al., ICML 2021, arXiv 2106.05609): METIS clusters as batches, the out-of-batch neighbours read from the history
tables, written by the chunk that owns them when it last ran. Cluster-GCN (Chiang et al., KDD 2019) also puts several
clusters in a batch, drawn at random each epoch (PyG's ``ClusterLoader``), but drops the edges between batches.

Groupings (:data:`CHUNK_GROUPS`):

* ``"fixed"``: consecutive chunks of the plan's order (the greedy order puts chunks that read each other next to each
  other, so a group reads many of its halo rows from chunks of the same step), the same groups in the same order
  every epoch;
* ``"shuffle"``: a new random split of the chunks into groups every epoch, the groups in a random order (as
  ``ClusterLoader(shuffle=True)``); inside a group the chunks keep the plan's order. Seeded by ``seed`` and the epoch,
  so every rank draws the same groups.

With hybrid parallelism (``G`` partitions, chunk ``j * G + g`` in slot ``j``) a group is a set of slots: all ``G``
chunks of each, so that every pipeline runs its own chunk of the same slots in the same order.
"""

from __future__ import annotations

import copy
from typing import Any, List, Sequence, Tuple

import torch
from torch import Tensor
from torch.utils.data import Dataset, DistributedSampler
from torch_geometric.data import Data

CHUNK_GROUPS = ("fixed", "shuffle")
"""The groupings :func:`step_groups` knows."""

_WHERE = "GraphChunkDataModule"


def check_chunks_per_step(chunks_per_step: object, num_chunks: int, num_parts: int, chunk_groups: object,
                          has_train_mask: bool) -> int:
    """Return ``chunks_per_step`` as an int (``None``: ``num_chunks``, one step an epoch) or raise.

    Raises:
        TypeError: ``chunks_per_step`` is neither ``None`` nor an int.
        ValueError: It is not in ``[1, K]``, does not divide ``K``, is not a multiple of ``G = num_parts``; an unknown
            ``chunk_groups``; or ``c < K`` for a graph without ``train_mask`` (each step's loss is taken over the
            labelled nodes of its chunks, handed to ``training_step`` as ``batch.train_mask``).
    """
    if chunk_groups not in CHUNK_GROUPS:
        raise ValueError(f"{_WHERE}: unknown `chunk_groups` {chunk_groups!r}. Use one of {CHUNK_GROUPS}.")
    if chunks_per_step is None:
        return num_chunks
    if isinstance(chunks_per_step, bool) or not isinstance(chunks_per_step, int):
        raise TypeError(f"{_WHERE}: `chunks_per_step` must be an int or None (got "
                        f"{type(chunks_per_step).__name__}).")
    c, k = chunks_per_step, num_chunks
    if not 1 <= c <= k or k % c:
        divisors = [d for d in range(num_parts, k + 1, num_parts) if k % d == 0]  # the values both rules allow
        raise ValueError(f"{_WHERE}: `chunks_per_step` must divide `num_chunks` ({k}) so that every step runs as many "
                         f"chunks (got {c}). Use one of {divisors}, or None for one step an epoch.")
    if c % num_parts:
        raise ValueError(f"{_WHERE}: `chunks_per_step` must be a multiple of `num_parts` ({num_parts}): every "
                         f"partition's pipeline runs its own chunk of each slot in the step (got {c}). Use e.g. "
                         f"chunks_per_step={num_parts * max(1, c // num_parts)}.")
    if c < k and not has_train_mask:
        raise ValueError(f"{_WHERE}: `chunks_per_step={c}` < num_chunks={k} needs `data.train_mask` (got none): each "
                         "step's loss is taken over the labelled nodes of its chunks, given to training_step as "
                         "batch.train_mask. Add a train_mask, or leave chunks_per_step=None.")
    return c


def step_groups(num_chunks: int, chunks_per_step: int, chunk_groups: str = "fixed", epoch: int = 0, seed: int = 0,
                num_parts: int = 1) -> List[List[int]]:
    """The chunk groups of one epoch, in the order they run: ``K / c`` lists of ``c`` chunk ids.

    Args:
        num_chunks: ``K``.
        chunks_per_step: ``c``, a divisor of ``K`` and a multiple of ``num_parts``.
        chunk_groups: ``"fixed"`` or ``"shuffle"`` (module docstring).
        epoch: The epoch (``"shuffle"`` draws its groups from ``seed`` and ``epoch``).
        seed: The shuffle's seed.
        num_parts: ``G``; a group then holds every chunk ``j * G + g`` of its slots ``j``, slot by slot.

    Returns:
        The groups; inside each the chunks in the plan's (slot) order. Every chunk is in exactly one group.
    """
    slots, per = num_chunks // num_parts, chunks_per_step // num_parts
    if chunk_groups == "shuffle":
        g = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
        drawn = torch.randperm(slots, generator=g).tolist()
        slot_groups = [sorted(drawn[i:i + per]) for i in range(0, slots, per)]
    else:
        slot_groups = [list(range(i, i + per)) for i in range(0, slots, per)]
    return [[j * num_parts + p for j in group for p in range(num_parts)] for group in slot_groups]


def chunk_positions(groups: Sequence[Sequence[int]], num_chunks: int, num_parts: int = 1) -> Tensor:
    """Position ``(K,)`` of every chunk's slot in an epoch that runs ``groups`` in order (``0 .. K/G - 1``): the
    chunks of one slot share it."""
    position = torch.empty(num_chunks, dtype=torch.long)
    order = [c for group in groups for c in group]
    for i, c in enumerate(order):
        position[c] = i // num_parts
    return position


class ChunkGroups(Dataset):
    """The training batches of one graph, one per chunk group: ``dataset[group]`` is the step's batch.

    The batch is a shallow copy of the graph (every tensor shared) whose ``train_mask`` keeps the labelled nodes of
    the group's chunks only, with ``chunk_ids`` ``(c,)`` (``torch.long``, on the CPU) naming them in the order they
    run. A user's ``training_step`` then computes the step's loss over those nodes unchanged.

    Args:
        data: The graph (with ``train_mask``).
        nodes: Inner node ids of every chunk (``K`` tensors).
        num_groups: ``K / c``.
    """

    def __init__(self, data: Data, nodes: Sequence[Tensor], num_groups: int) -> None:
        self.data, self.nodes, self.num_groups = data, list(nodes), num_groups

    def __len__(self) -> int:
        return self.num_groups

    def __getitem__(self, group: Tuple[int, ...]) -> Data:
        ids = torch.tensor(list(group), dtype=torch.long)
        inside = torch.zeros(self.data.num_nodes, dtype=torch.bool)
        inside[torch.cat([self.nodes[c] for c in group])] = True
        batch = copy.copy(self.data)
        batch.train_mask = self.data.train_mask & inside
        batch.chunk_ids = ids
        return batch


class ChunkGroupSampler(DistributedSampler):
    """Yield an epoch's chunk groups (:func:`step_groups`), as tuples, for :class:`ChunkGroups`.

    A ``DistributedSampler`` of one replica: the job is one data-parallel replica (every rank runs every group), so
    Lightning uses this sampler as it is instead of wrapping it in one of its own, and calls :meth:`set_epoch` at
    every epoch's start, which seeds ``"shuffle"``.
    """

    def __init__(self, dataset: ChunkGroups, num_chunks: int, chunks_per_step: int, chunk_groups: str, seed: int,
                 num_parts: int) -> None:
        super().__init__(dataset, num_replicas=1, rank=0, shuffle=chunk_groups == "shuffle", seed=seed)
        self.num_chunks, self.chunks_per_step, self.chunk_groups = num_chunks, chunks_per_step, chunk_groups
        self.num_parts = num_parts

    def __iter__(self) -> Any:
        groups = step_groups(self.num_chunks, self.chunks_per_step, self.chunk_groups, self.epoch, self.seed,
                             self.num_parts)
        return iter([tuple(g) for g in groups])

    def __len__(self) -> int:
        return self.num_chunks // self.chunks_per_step
