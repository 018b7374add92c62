"""``lightning-gnnpipe partition``: partition a graph once, on one machine, for :meth:`GraphChunkDataModule.
from_partitions <lightning_gnnpipe.GraphChunkDataModule.from_partitions>`.

    lightning-gnnpipe partition --data graph.pt --num-parts 2 --num-chunks 16 --out parts/
    lightning-gnnpipe partition --dataset torch_geometric.datasets.Planetoid --root data/ --name Cora \\
        --num-parts 2 --num-chunks 8 --out cora_parts/
    lightning-gnnpipe partition --dataset ogb.nodeproppred.PygNodePropPredDataset --root data/ \\
        --name ogbn-products --num-parts 4 --num-chunks 64 --out products_parts/

``--data`` is a ``torch.save``d :class:`~torch_geometric.data.Data` (opened ``mmap=True``: the features are read a
partition at a time). ``--dataset`` is a PyG dataset class (OGB's ``PygNodePropPredDataset`` included, with
``pip install -e ".[ogb]"`` in a clone) whose files are already under ``--root``: it is never downloaded. OGB's
``get_idx_split()`` becomes the masks and a ``(|V|, 1)`` label column becomes ``(|V|,)``.
"""

from __future__ import annotations

import argparse
import importlib
from typing import List, Optional

import torch
from torch_geometric.data import Data
from torch_geometric.utils import index_to_mask

from lightning_gnnpipe.data.partitioned.write import partition_graph


def load_graph(data: Optional[str], dataset: Optional[str], root: Optional[str], name: Optional[str]) -> Data:
    """The graph named on the command line (module docstring).

    Raises:
        ValueError: Neither or both of ``data`` and ``dataset``; a dataset class that is not ``module.Class``.
        FileNotFoundError: The dataset's files are not under ``root`` (no download is tried).
        TypeError: ``data`` holds no ``Data``.
    """
    if (data is None) == (dataset is None):
        raise ValueError("lightning-gnnpipe partition: give --data PATH (a torch.save'd Data) or --dataset CLASS "
                         f"--root DIR, one of them (got --data={data!r}, --dataset={dataset!r}).")
    if data is not None:
        graph = torch.load(data, map_location="cpu", weights_only=False, mmap=True)
        if not isinstance(graph, Data):
            raise TypeError(f"lightning-gnnpipe partition: {data} holds a {type(graph).__name__}, not a "
                            "torch_geometric.data.Data. Save the graph with torch.save(data, PATH).")
        return graph
    module, _, cls_name = dataset.rpartition(".")
    if not module:
        raise ValueError(f"lightning-gnnpipe partition: --dataset takes module.Class (got {dataset!r}), e.g. "
                         "torch_geometric.datasets.Planetoid.")
    cls = getattr(importlib.import_module(module), cls_name)

    def refuse(self) -> None:
        raise FileNotFoundError(f"lightning-gnnpipe partition: {dataset} has no files under {root!r} and is never "
                                "downloaded here. Download it first (on a machine with the internet), then give "
                                "its root.")

    offline = type(cls.__name__, (cls,), {"download": refuse})
    kwargs = {"root": root} if name is None else {"root": root, "name": name}
    ds = offline(**kwargs)
    graph = ds[0]
    if hasattr(ds, "get_idx_split"):  # OGB: the split as masks
        split = ds.get_idx_split()
        for name, mask in (("train", "train_mask"), ("valid", "val_mask"), ("test", "test_mask")):
            graph[mask] = index_to_mask(split[name], graph.num_nodes)
    if isinstance(graph.y, torch.Tensor) and graph.y.dim() == 2 and graph.y.size(1) == 1:
        graph.y = graph.y.view(-1)
    return graph


def main(argv: Optional[List[str]] = None) -> dict:
    """Run ``lightning-gnnpipe partition`` on ``argv``; return the written ``META.json`` content."""
    parser = argparse.ArgumentParser(prog="lightning-gnnpipe partition",
                                     description="Partition a graph once for GraphChunkDataModule.from_partitions.")
    parser.add_argument("--data", help="a torch.save'd torch_geometric.data.Data")
    parser.add_argument("--dataset", help="a PyG dataset class, module.Class, with its files under --root")
    parser.add_argument("--root", help="the dataset's root directory")
    parser.add_argument("--name", help="the dataset's name argument (Planetoid's Cora, OGB's ogbn-products)")
    parser.add_argument("--num-parts", type=int, required=True,
                        help="G: graph_parallel_size of GNNPipeStrategy, or the processes of GraphParallelStrategy")
    parser.add_argument("--num-chunks", type=int, required=True, help="K, a multiple of G")
    parser.add_argument("--chunk-order", default="greedy", choices=["greedy", "metis"])
    parser.add_argument("--out", required=True, help="the directory to create (it must not exist)")
    args = parser.parse_args(argv)
    graph = load_graph(args.data, args.dataset, args.root, args.name)
    return partition_graph(graph, args.num_parts, args.num_chunks, args.out, chunk_order=args.chunk_order)
