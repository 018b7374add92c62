"""Load one partition of a partitioned graph: what one rank holds (:mod:`~lightning_gnnpipe.data.partitioned.layout`).

A rank of partition ``g`` holds the chunk plan (``|V|`` chunk ids, the halos' ids, the degrees: ``O(|V|)``), the
labels and masks (``|V|``: every rank runs the user's steps on the whole graph's logits), the edges into its
partition's nodes and, where its stages read them, the features of its partition and halo
(:class:`~lightning_gnnpipe.data.node_rows.NodeRows`); not the whole edge list or feature matrix.
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch_geometric.data import Data

from lightning_gnnpipe.data.chunk import ChunkPlan
from lightning_gnnpipe.data.node_rows import NodeRows
from lightning_gnnpipe.data.partitioned.layout import LABELS, PLAN, PartitionDirectory, part_features, part_graph


def _load(path: str, mmap: bool = False):
    return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


def load_plan(directory: PartitionDirectory) -> Tuple[ChunkPlan, torch.Tensor]:
    """The chunk plan (with the whole graph's degrees when ``G > 1``) and the edge counts between chunks ``(K, K)``.

    Raises:
        FileNotFoundError, ValueError: ``plan.pt`` is missing, truncated or changed.
    """
    saved = _load(directory.file(PLAN))
    part = saved["part"].long()
    order = torch.sort(part, stable=True).indices  # every chunk's nodes, ascending
    sizes = torch.bincount(part, minlength=directory.num_chunks).tolist()
    nodes = [ids.clone() for ids in torch.split(order, sizes)]
    degrees = tuple(d.long() for d in saved["degrees"]) if directory.num_parts > 1 else None
    plan = ChunkPlan(part=part, nodes=nodes, halo=list(saved["halo"]), edge_cut=float(saved["edge_cut"]),
                     degrees=degrees)
    return plan, saved["edge_counts"]


def load_edges(directory: PartitionDirectory, g: int):
    """Partition ``g``'s edges ``(2, E_g)``: those into its nodes, global ids, in the graph's order."""
    return _load(directory.file(part_graph(g)))


def load_partition(directory: PartitionDirectory, g: int, features: bool = True) -> Data:
    """Partition ``g``'s graph: ``edge_index`` ``(2, E_g)`` (the edges into its nodes, global ids), ``y`` and the masks
    ``(|V|,)``, ``num_nodes = |V|`` and ``x``: the partition's and its halo's feature rows (``features``), a full
    ``(|V|, F)`` tensor when that is every node (``G = 1``), else :class:`~lightning_gnnpipe.data.node_rows.NodeRows`;
    without ``features``, the first two rows only (what a stage that never reads features needs: the width and
    dtype).

    Raises:
        IndexError: ``g`` is not a partition of the directory.
        FileNotFoundError, ValueError: A file it reads is missing, truncated or changed.
    """
    if not 0 <= g < directory.num_parts:
        raise IndexError(f"partitioned graph {directory.path}: no partition {g} (it has {directory.num_parts}).")
    n = directory.num_nodes
    data = Data(edge_index=load_edges(directory, g), num_nodes=n)
    for name, value in _load(directory.file(LABELS)).items():
        data[name] = value
    stored = _load(directory.file(part_features(g)), mmap=not features)
    ids, x = stored["ids"], stored["x"]
    if not features:
        ids, x = ids[:2].clone(), x[:2].clone()  # the mapped file is let go of here
    data.x = x if ids.numel() == n else NodeRows(ids, x, n)
    return data
