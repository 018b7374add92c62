"""The scale benchmark's graph and models: a sparse stochastic block model built in ``O(|E|)`` and PyG GCN / GraphSAGE.

Shared by the worker (:mod:`benchmarks.scale.worker`), the planner's estimate (:mod:`benchmarks.scale.planner`) and
the hybrid memory measurement (:mod:`benchmarks.scale.hybrid_memory`).
"""

from __future__ import annotations

from typing import List

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.nn.models import GCN, GraphSAGE
from torch_geometric.utils import to_torch_csr_tensor

from lightning_gnnpipe.data.partition import symmetric_csr


def sbm(num_nodes: int, num_blocks: int = 64, avg_degree: int = 20, num_features: int = 64, num_classes: int = 8,
        p_in: float = 0.8, seed: int = 0) -> Data:
    """A sparse stochastic-block-model graph in ``O(|E|)`` (adapted from ``benchmarks/performance/parallelism.py``).

    Nodes ``0..N-1`` form ``num_blocks`` contiguous blocks of ``N / num_blocks`` nodes; the class of a node is its
    block modulo ``num_classes``. Each of ``N * avg_degree / 2`` undirected edges starts at a uniform node and
    ends, with probability ``p_in``, at a uniform node of the same block, else at a uniform node; self loops are
    dropped, so the mean degree is slightly under ``avg_degree``. Features: standard normal plus the one-hot class.
    Masks: a random 50 / 25 / 25 train / val / test split.
    """
    g = torch.Generator().manual_seed(seed)
    block = torch.arange(num_nodes) * num_blocks // num_nodes
    starts = (torch.arange(num_blocks + 1) * num_nodes + num_blocks - 1) // num_blocks  # first node of each block
    e = num_nodes * avg_degree // 2
    src = torch.randint(num_nodes, (e,), generator=g)
    b = block[src]
    inside = starts[b] + (torch.rand(e, generator=g) * (starts[b + 1] - starts[b])).long()
    dst = torch.where(torch.rand(e, generator=g) < p_in, inside, torch.randint(num_nodes, (e,), generator=g))
    del b, inside
    rowptr, col = symmetric_csr(torch.stack([src, dst]), num_nodes)  # = coalesce(to_undirected(loop-free edges))
    del src, dst
    rows = torch.from_numpy(np.repeat(np.arange(num_nodes, dtype=np.int64), np.diff(rowptr)))
    edge_index = torch.stack([rows, torch.from_numpy(col)])
    del rows, col
    y = block % num_classes
    x = torch.randn(num_nodes, num_features, generator=g)
    x[torch.arange(num_nodes), y % num_features] += 1.0  # + one_hot(class), in place
    masks = split_masks(num_nodes, g)
    return Data(x=x, edge_index=edge_index, y=y, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])


def split_masks(num_nodes: int, generator: torch.Generator) -> List[torch.Tensor]:
    """A random 50 / 25 / 25 split of the nodes: train, validation and test masks ``(|V|,)`` bool."""
    perm = torch.randperm(num_nodes, generator=generator)
    masks = [torch.zeros(num_nodes, dtype=torch.bool) for _ in range(3)]
    for i, ids in enumerate((perm[: num_nodes // 2], perm[num_nodes // 2: 3 * num_nodes // 4],
                             perm[3 * num_nodes // 4:])):
        masks[i][ids] = True
    return masks


def graph_from_spec(spec: dict) -> Data:
    """The SBM graph a spec names."""
    return sbm(spec["nodes"], spec["blocks"], spec["degree"], spec["features"], spec["classes"], spec["p_in"],
               spec["seed"])


def build_model(spec: dict, normalize: bool = True) -> torch.nn.Module:
    """PyG ``GCN`` or ``GraphSAGE``, ``hidden`` wide and ``layers`` deep, seeded (``normalize``: GCN only)."""
    torch.manual_seed(spec["seed"])
    args = (spec["features"], spec["hidden"], spec["layers"], spec["classes"])
    if spec["model"] == "gcn":
        return GCN(*args) if normalize else GCN(*args, normalize=False)
    if spec["model"] == "sage":
        return GraphSAGE(*args)
    raise ValueError(f"scale benchmark: unknown model {spec['model']!r}. Use gcn or sage.")


def csr_adjacency(edge_index: torch.Tensor, num_nodes: int, model: str) -> torch.Tensor:
    """The transposed adjacency ``adj_t`` (row = target node) as a torch CSR tensor.

    GCN: symmetric normalisation with self loops (``gcn_norm``) baked into the values, for convs built with
    ``normalize=False``. SAGE: unweighted; ``SAGEConv`` aggregates it with ``spmm(reduce="mean")``.
    """
    if model == "gcn":
        ei, weight = gcn_norm(edge_index, None, num_nodes, add_self_loops=True)
        return to_torch_csr_tensor(ei.flip(0), weight, size=(num_nodes, num_nodes))
    return to_torch_csr_tensor(edge_index.flip(0), size=(num_nodes, num_nodes))
