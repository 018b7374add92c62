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

DATA_ROOT = Path(os.environ.get("GNNPIPE_DATA", Path(__file__).resolve().parents[1] / "datasets"))
"""Folder with the raw files (``$GNNPIPE_DATA``, default ``<checkout>/datasets``)."""

PLANETOID = ("Cora", "CiteSeer")


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
    raw = DATA_ROOT / "Planetoid" / name / "raw"
    if not raw.is_dir():
        raise FileNotFoundError(
            f"load_planetoid: no raw files at {raw}. Run from a clone of the repository or set $GNNPIPE_DATA."
        )
    cache_dir = Path(cache or os.path.join(tempfile.gettempdir(), "lightning_gnnpipe_data"))
    dst = cache_dir / "Planetoid" / name / "raw"
    if not dst.is_dir():
        tmp = cache_dir / f".tmp-{os.getpid()}-{name}"
        shutil.copytree(raw, tmp / "raw")
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(tmp / "raw", dst)
        except OSError:
            pass  # another process won the race; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return Planetoid(str(cache_dir / "Planetoid"), name)[0]
