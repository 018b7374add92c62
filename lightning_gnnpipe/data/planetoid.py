"""``PlanetoidChunkDataModule``: a shipped Planetoid graph by name, for configs and the CLI."""

from __future__ import annotations

from typing import Optional

from lightning_gnnpipe.data.datamodule import GraphChunkDataModule


class PlanetoidChunkDataModule(GraphChunkDataModule):
    """Load a Planetoid graph (public split) from the repository's files and cut it into chunks.

    The graph comes from :func:`~lightning_gnnpipe.datasets.load_planetoid` (offline, from
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
        from lightning_gnnpipe.datasets import load_planetoid

        super().__init__(load_planetoid(name, cache=cache), num_chunks=num_chunks)
        self.name = name

    @property
    def num_features(self) -> int:
        """Width ``F`` of the node features."""
        return int(self.data.num_features)

    @property
    def num_classes(self) -> int:
        """Number of classes ``C`` (labels are ``0 .. C-1``)."""
        return int(self.data.y.max()) + 1
