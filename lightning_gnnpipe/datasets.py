"""Load the real graphs shipped in the repository's ``datasets/`` folder, offline.

PyG dataset classes write a ``processed/`` folder beside ``raw/``; the shipped files are
copied into a writable cache first, so the checkout stays clean and nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from torch_geometric.data import Data

from lightning_gnnpipe.data.datamodule import GraphChunkDataModule

DATA_ROOT = Path(os.environ.get("GNNPIPE_DATA", Path(__file__).resolve().parents[1] / "datasets"))
"""Folder with the raw files (``$GNNPIPE_DATA``, default ``<checkout>/datasets``)."""

PLANETOID = ("Cora", "CiteSeer")


def _cached_root(folder: str, name: str, cache: Optional[str] = None) -> Path:
    """Copy ``DATA_ROOT/<folder>/<name>/raw`` into a writable cache once; return ``<cache>/<folder>``."""
    raw = DATA_ROOT / folder / name / "raw"
    if not raw.is_dir():
        raise FileNotFoundError(
            f"lightning_gnnpipe.datasets: no raw files at {raw}. Run from a clone of the repository or set "
            "$GNNPIPE_DATA."
        )
    cache_dir = Path(cache or os.path.join(tempfile.gettempdir(), "lightning_gnnpipe_data"))
    dst = cache_dir / folder / name / "raw"
    if not dst.is_dir():
        tmp = cache_dir / f".tmp-{os.getpid()}-{name}"
        shutil.copytree(raw, tmp / "raw")
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(tmp / "raw", dst)
        except OSError:
            pass  # another process won the race; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return cache_dir / folder


def load_planetoid(name: str, cache: Optional[str] = None) -> Data:
    """Return the Planetoid graph ``name`` (``"Cora"`` or ``"CiteSeer"``) with its public split.

    Args:
        name: Dataset name.
        cache: Writable folder for PyG's processed files (default: a folder under the system
            temp dir).

    Raises:
        ValueError: Unknown name.
        FileNotFoundError: The raw files are not in :data:`DATA_ROOT`.
    """
    from torch_geometric.datasets import Planetoid

    if name not in PLANETOID:
        raise ValueError(f"load_planetoid: unknown dataset {name!r}. Shipped: {list(PLANETOID)}.")
    return Planetoid(str(_cached_root("Planetoid", name, cache)), name)[0]


def load_tolokers(split: int = 0, cache: Optional[str] = None) -> Data:
    """Return Tolokers (Platonov et al., ICLR 2023) with split ``split`` of its 10 as 1-D masks.

    Raises:
        FileNotFoundError: The raw files are not in :data:`DATA_ROOT`.
    """
    from torch_geometric.datasets import HeterophilousGraphDataset

    data = HeterophilousGraphDataset(str(_cached_root("HeterophilousGraphDataset", "tolokers", cache)),
                                     "Tolokers")[0]
    for key in ("train_mask", "val_mask", "test_mask"):
        data[key] = data[key][:, split]
    return data


def load_cornell5(seed: int = 0, cache: Optional[str] = None) -> Data:
    """Return Cornell5 (Facebook100 via LINKX, Lim et al., NeurIPS 2021) with a random 50/25/25 split.

    PyG ships no masks for it; the split is drawn over the labelled nodes (``y >= 0``) with
    ``seed``, so unlabelled users are in no mask.

    Raises:
        FileNotFoundError: The raw files are not in :data:`DATA_ROOT`.
    """
    import torch
    from torch_geometric.datasets import LINKXDataset

    data = LINKXDataset(str(_cached_root("LINKXDataset", "cornell5", cache)), "cornell5")[0]
    labelled = (data.y >= 0).nonzero().view(-1)
    perm = labelled[torch.randperm(labelled.numel(), generator=torch.Generator().manual_seed(seed))]
    cut = [perm.numel() // 2, 3 * perm.numel() // 4]
    for key, ids in zip(("train_mask", "val_mask", "test_mask"), (perm[: cut[0]], perm[cut[0]: cut[1]],
                                                                   perm[cut[1]:])):
        mask = torch.zeros(data.num_nodes, dtype=torch.bool)
        mask[ids] = True
        data[key] = mask
    return data


def load_actor(split: int = 0, cache: Optional[str] = None) -> Data:
    """Return Actor (film co-occurrence, Pei et al., ICLR 2020) with geom-gcn split ``split`` as 1-D masks.

    The graph is loaded as stored (directed, with self-loops).

    Raises:
        FileNotFoundError: The raw files are not in :data:`DATA_ROOT`.
    """
    from torch_geometric.datasets import Actor

    # Actor's raw files sit in <root>/Actor/raw (no per-name folder), which `_cached_root("", "Actor")` copies.
    data = Actor(str(_cached_root("", "Actor", cache) / "Actor"))[0]
    for key in ("train_mask", "val_mask", "test_mask"):
        data[key] = data[key][:, split]
    return data


class PlanetoidChunkDataModule(GraphChunkDataModule):
    """Load a Planetoid graph (public split) from the repository's files and cut it into chunks.

    The graph comes from :func:`load_planetoid` (offline, from
    ``$GNNPIPE_DATA`` or ``<checkout>/datasets``), so a YAML config can name it:
    ``data: {name: Cora, num_chunks: 8}``.

    Args:
        name: ``"Cora"`` or ``"CiteSeer"``.
        num_chunks: Number of chunks ``K`` (pipeline micro-batches per step).
        cache: Writable folder for PyG's processed files (default: under the system temp dir).

    Raises:
        ValueError: Unknown ``name`` or bad ``num_chunks``.
        TypeError: ``num_chunks`` is not an int.
        FileNotFoundError: The raw files are missing.
    """

    def __init__(self, name: str = "Cora", num_chunks: int = 8, cache: Optional[str] = None) -> None:
        super().__init__(load_planetoid(name, cache=cache), num_chunks=num_chunks)
        self.name = name
