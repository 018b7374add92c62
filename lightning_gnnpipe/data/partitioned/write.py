"""``partition_graph``: cut a graph once, offline, into the directory each rank loads its part from.

The plan is :func:`~lightning_gnnpipe.data.datamodule.make_chunk_plan`'s, the one
:class:`~lightning_gnnpipe.GraphChunkDataModule` builds in memory, so a fit from the directory trains the same
steps. The partitioner holds the edge list, METIS's symmetric CSR copy (:func:`~lightning_gnnpipe.data.partition.
symmetric_csr`) and the plan; the features it writes a partition at a time (with a graph file opened
``mmap=True`` it reads each partition's rows from disk, never the whole ``X``). Everything is written under a
temporary name and renamed when complete, so an interrupted run leaves no directory that loads.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import time
from typing import Any, Dict, Optional

import torch
from torch import Tensor
from torch_geometric.data import Data

from lightning_gnnpipe.data.datamodule import make_chunk_plan
from lightning_gnnpipe.data.order import edge_counts
from lightning_gnnpipe.data.partitioned.layout import (FORMAT, LABELS, META, PLAN, VERSION, part_features,
                                                        part_graph, sha256)
from lightning_gnnpipe.data.validation import (MASKS, validate_graph, validate_num_chunks, validate_num_parts,
                                               validate_part)


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far, in bytes (``ru_maxrss``)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) * (1 if sys.platform == "darwin" else 1024)


def partition_graph(data: Data, num_parts: int, num_chunks: int, out_dir: str, part: Optional[Tensor] = None,
                    chunk_order: str = "greedy", verbose: bool = True) -> Dict[str, Any]:
    """Partition ``data`` into ``G`` partitions of ``K / G`` chunks each and write them to ``out_dir``.

    Load it with ``GraphChunkDataModule.from_partitions(out_dir)``: each rank then reads only its partition's edges
    and features (:mod:`~lightning_gnnpipe.data.partitioned.layout` gives the files).

    Args:
        data: The graph, as :class:`~lightning_gnnpipe.GraphChunkDataModule` takes it: ``x`` ``(|V|, F)``,
            ``edge_index`` ``(2, |E|)``, optional ``y`` and boolean masks ``(|V|,)``.
        num_parts: ``G``: the hybrid layout's graph partitions (``GNNPipeStrategy(graph_parallel_size=G)``) or the
            processes of ``GraphParallelStrategy`` (with ``num_chunks = G``); 1 for pure pipeline parallelism.
        num_chunks: ``K``, a multiple of ``G``.
        out_dir: The directory to create; it must not exist (nothing is written over).
        part: Optional chunk id per node ``(|V|,)``, as the DataModule's ``part``.
        chunk_order: ``"greedy"`` or ``"metis"``, as the DataModule's.
        verbose: Print each phase with its seconds, and the peak memory.

    Returns:
        The ``META.json`` content (``seconds`` per phase, ``peak_bytes`` of the partitioning process, the edge cut and
        every partition's ``nodes``, ``halo`` and ``edges``).

    Raises:
        FileExistsError: ``out_dir`` exists.
        TypeError, ValueError: A malformed graph, ``num_chunks``, ``num_parts`` or ``part`` (as the DataModule's).
    """
    out_dir = os.path.normpath(os.fspath(out_dir))  # "parts/" names the directory "parts" (its sibling is the temp)
    if os.path.exists(out_dir):
        kind = "directory" if os.path.isdir(out_dir) else "file"
        raise FileExistsError(f"partition_graph: {out_dir!r} exists (got a {kind}). Give a new directory; nothing is "
                              "written over.")
    validate_graph(data)
    num_nodes, num_edges = int(data.num_nodes), int(data.edge_index.size(1))
    num_chunks = validate_num_chunks(num_chunks, num_nodes)
    num_parts = validate_num_parts(num_parts, num_chunks)
    if chunk_order not in ("greedy", "metis"):
        raise ValueError(f"partition_graph: unknown `chunk_order` {chunk_order!r}. Use 'greedy' or 'metis'.")
    if part is not None:
        validate_part(part, num_nodes, num_chunks)
    seconds: Dict[str, float] = {}

    def say(text: str) -> None:
        if verbose:
            print(f"partition_graph: {text}", flush=True)

    tmp = f"{out_dir}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        t0 = time.perf_counter()
        edge_index = data.edge_index
        say(f"METIS: {num_nodes:,} nodes, {num_edges:,} edges into {num_parts} partitions x "
            f"{num_chunks // num_parts} chunks")
        plan = make_chunk_plan(edge_index, num_nodes, num_chunks, num_parts, part, chunk_order)
        seconds["metis_and_plan"] = time.perf_counter() - t0
        say(f"plan done in {seconds['metis_and_plan']:.1f} s (edge cut {plan.edge_cut:.4f})")

        t0 = time.perf_counter()
        src, dst = edge_index[0], edge_index[1]
        with_loops = torch.bincount(dst, minlength=num_nodes)
        without_loops = with_loops - torch.bincount(dst[src == dst], minlength=num_nodes)
        owner = (plan.part % num_parts).to(torch.int16 if num_parts < 2**15 else torch.int32)
        cut = float((owner[src] != owner[dst]).float().mean()) if num_edges else 0.0
        torch.save({"part": plan.part.to(torch.int32), "halo": plan.halo, "edge_cut": plan.edge_cut,
                    "degrees": (without_loops.to(torch.int32), with_loops.to(torch.int32)),
                    "edge_counts": edge_counts(plan, edge_index)}, os.path.join(tmp, PLAN))
        del with_loops, without_loops
        labels = {name: data[name] for name in ("y",) + MASKS if isinstance(getattr(data, name, None), Tensor)}
        torch.save(labels, os.path.join(tmp, LABELS))
        seconds["plan_and_labels"] = time.perf_counter() - t0

        parts = []
        for g in range(num_parts):
            t0 = time.perf_counter()
            os.makedirs(os.path.join(tmp, f"part_{g}"))
            into = owner[dst] == g
            edges = edge_index[:, into]
            del into
            torch.save(edges, os.path.join(tmp, part_graph(g)))
            chunks = range(g, num_chunks, num_parts)
            own = torch.cat([plan.nodes[c] for c in chunks])
            ids = torch.cat([own] + [plan.halo[c] for c in chunks]).unique()  # sorted
            torch.save({"ids": ids, "x": data.x[ids].contiguous()}, os.path.join(tmp, part_features(g)))
            parts.append({"nodes": int(own.numel()), "halo": int(ids.numel() - own.numel()),
                          "edges": int(edges.size(1))})
            del edges, ids, own
            seconds[f"part_{g}"] = time.perf_counter() - t0
            say(f"partition {g + 1} of {num_parts}: {parts[-1]['nodes']:,} nodes, {parts[-1]['halo']:,} halo, "
                f"{parts[-1]['edges']:,} edges, {seconds[f'part_{g}']:.1f} s")

        t0 = time.perf_counter()
        files = {}
        for name in [PLAN, LABELS] + [p for g in range(num_parts) for p in (part_graph(g), part_features(g))]:
            path = os.path.join(tmp, name)
            files[name] = {"bytes": os.path.getsize(path), "sha256": sha256(path)}
        seconds["checksums"] = time.perf_counter() - t0
        peak = peak_rss_bytes()
        meta = {"format": FORMAT, "version": VERSION, "num_nodes": num_nodes, "num_edges": num_edges,
                "num_features": int(data.x.size(1)), "feature_dtype": str(data.x.dtype).replace("torch.", ""),
                "num_parts": num_parts, "num_chunks": num_chunks, "chunk_order": chunk_order,
                "num_classes": int(labels["y"].max()) + 1 if "y" in labels else None,
                "edge_cut": plan.edge_cut, "partition_edge_cut": cut, "has_y": "y" in labels,
                "masks": [m for m in MASKS if m in labels], "parts": parts, "files": files,
                "seconds": seconds, "peak_bytes": peak,
                "peak_bytes_per_million_edges": peak / max(num_edges / 1e6, 1e-9)}
        with open(os.path.join(tmp, META), "w") as f:
            json.dump(meta, f, indent=1)
        os.rename(tmp, out_dir)  # the directory loads only once complete
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    per_million = f" ({meta['peak_bytes_per_million_edges'] / 2**20:,.1f} MiB per million edges)" \
        if num_edges >= 10**6 else ""  # below a million edges the interpreter's own memory dominates
    say(f"wrote {out_dir} in {sum(seconds.values()):.1f} s; peak memory {peak / 2**20:,.0f} MiB{per_million}")
    return meta
