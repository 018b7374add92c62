"""The on-disk layout of a partitioned graph, and the checks a directory passes before anything loads from it.

The layout follows PyG's ``torch_geometric.distributed.Partitioner`` (a ``META.json`` and one ``part_{g}/`` folder
per partition whose ``graph.pt`` holds the in-edges of its nodes with global ids, and ``node_feats.pt`` the
features), so a user who knows that format reads this one; it adds what GNNPipe needs and that format lacks: the
chunk plan, the labels and masks, the whole graph's degrees (for GCN's full-graph normalisation), a format version
and a checksum of every file. Node ids stay the graph's own (no renumbering): a rank holds ``|V|`` chunk ids
(``8 |V|`` bytes) to find any node's chunk, and the predictions come out in the user's order::

    DIR/
      META.json              format, version, counts, the chunk plan's summary, every file's bytes and sha256
      plan.pt                chunk id per node (|V|,), every chunk's halo ids, the degrees (2 x |V|),
                             the edge counts between chunks (K, K)
      labels.pt              y and the masks (|V|,): every rank runs the user's steps on the whole graph's logits
      part_{g}/graph.pt      edge_index (2, E_g): the edges into partition g's nodes, global ids, the graph's order
      part_{g}/node_feats.pt ids (n_g + h_g,) sorted, x (n_g + h_g, F): partition g's nodes and their halo

Partition ``g`` holds the chunks ``c`` with ``c % G == g`` (:func:`~lightning_gnnpipe.data.partition.
nested_partition`), the rows a hybrid rank ``(s, g)`` or a graph-parallel rank ``g`` reads.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List

FORMAT = "lightning_gnnpipe.partitions"
VERSION = 1
META = "META.json"
PLAN = "plan.pt"
LABELS = "labels.pt"


def part_graph(g: int) -> str:
    """Path of partition ``g``'s edges, relative to the directory."""
    return f"part_{g}/graph.pt"


def part_features(g: int) -> str:
    """Path of partition ``g``'s features, relative to the directory."""
    return f"part_{g}/node_feats.pt"


def sha256(path: str) -> str:
    """Hex sha256 of a file (``hashlib.file_digest``, read in blocks)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@dataclass
class PartitionDirectory:
    """What ``META.json`` says about a partitioned graph (read by :func:`read_meta`; small: no tensor).

    Attributes:
        path: The directory.
        meta: ``META.json``'s content: ``num_nodes``, ``num_edges``, ``num_features``, ``num_parts``, ``num_chunks``,
            ``chunk_order``, ``edge_cut``, ``masks`` (the masks present), ``has_y``, ``parts`` (per partition its
            ``nodes``, ``halo``, ``edges``), ``files`` (per relative path its ``bytes`` and ``sha256``).
    """

    path: str
    meta: Dict[str, Any]

    @property
    def num_parts(self) -> int:
        return int(self.meta["num_parts"])

    @property
    def num_chunks(self) -> int:
        return int(self.meta["num_chunks"])

    @property
    def num_nodes(self) -> int:
        return int(self.meta["num_nodes"])

    @property
    def masks(self) -> List[str]:
        return list(self.meta["masks"])

    def file(self, name: str) -> str:
        """The absolute path of ``name``, after checking that it exists with its recorded size and checksum.

        Raises:
            FileNotFoundError: The file is missing.
            ValueError: Its size or sha256 differs from ``META.json``'s (a truncated or replaced file).
        """
        path = os.path.join(self.path, name)
        check_file(self.path, name, self.meta["files"][name], checksum=True)
        return path


def check_file(root: str, name: str, record: Dict[str, Any], checksum: bool) -> None:
    """Raise if ``root/name`` is missing, has another size than ``record["bytes"]`` or (``checksum``) another
    sha256 than ``record["sha256"]``."""
    path = os.path.join(root, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"partitioned graph {root}: file {name} is missing. Partition the graph again "
                                "(lightning-gnnpipe partition) or copy the whole directory.")
    size = os.path.getsize(path)
    if size != int(record["bytes"]):
        raise ValueError(f"partitioned graph {root}: file {name} has {size} bytes, META.json records "
                         f"{record['bytes']} (a truncated or replaced file). Copy it again from the partitioner's "
                         "output.")
    if checksum:
        got = sha256(path)
        if got != record["sha256"]:
            raise ValueError(f"partitioned graph {root}: file {name} has sha256 {got[:16]}..., META.json records "
                             f"{record['sha256'][:16]}... (a changed or corrupt file). Copy it again from the "
                             "partitioner's output.")


def read_meta(path: str) -> PartitionDirectory:
    """Read and check ``path/META.json``: the format and version, that the files every rank reads (``plan.pt``,
    ``labels.pt``) are there, and that each listed file present has its recorded size. A machine may hold only the
    ``part_{g}/`` of its own ranks: a missing part file is an error of the rank that loads it (checksums are checked
    there too, :meth:`PartitionDirectory.file`).

    Raises:
        FileNotFoundError: ``path`` is not a directory, or has no ``META.json``, ``plan.pt`` or ``labels.pt``.
        ValueError: Another format or version, or a file of another size.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"partitioned graph: {path!r} is not a directory. Give the directory that "
                                "`lightning-gnnpipe partition --out DIR` wrote.")
    meta_path = os.path.join(path, META)
    if not os.path.isfile(meta_path):
        raise FileNotFoundError(f"partitioned graph {path}: no {META} (got {sorted(os.listdir(path))[:8]}). Give the "
                                "directory that `lightning-gnnpipe partition --out DIR` wrote; an interrupted run "
                                "leaves none.")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"partitioned graph {path}: {META} is not valid JSON ({exc}).") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"partitioned graph {path}: {META} has format {meta.get('format')!r}, not {FORMAT!r}. "
                         "Partition the graph with lightning-gnnpipe partition.")
    if meta.get("version") != VERSION:
        raise ValueError(f"partitioned graph {path}: format version {meta.get('version')!r}, this lightning_gnnpipe "
                         f"reads version {VERSION}. Partition the graph again with this version.")
    for name, record in meta["files"].items():
        if name in (PLAN, LABELS) or os.path.exists(os.path.join(path, name)):
            check_file(path, name, record, checksum=False)
    return PartitionDirectory(path, meta)
