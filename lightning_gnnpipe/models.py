"""A node classifier around any PyG ``BasicGNN``, configurable from YAML (used by the CLI)."""

from __future__ import annotations

import importlib
from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F
import torch_geometric.nn.models as pyg_models
from lightning.pytorch import LightningModule
from torch import Tensor
from torch_geometric.nn.models.basic_gnn import BasicGNN
from torchmetrics.functional import accuracy


def resolve_gnn(gnn: str) -> type:
    """Return the ``BasicGNN`` class named ``gnn``.

    Args:
        gnn: A class name in ``torch_geometric.nn.models`` (``"GCN"``, ``"GraphSAGE"``,
            ``"GIN"``, ``"GAT"``, ``"PNA"``, ``"EdgeCNN"``) or a dotted path
            (``"my_package.models.MyGNN"``).

    Raises:
        ValueError: If nothing of that name exists.
        TypeError: If it is not a ``BasicGNN`` subclass.
    """
    module_name, _, cls_name = gnn.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name) if module_name else pyg_models, cls_name)
    except (ImportError, AttributeError) as err:
        raise ValueError(
            f"NodeClassifier: no GNN class {gnn!r} (got gnn={gnn!r}). Use a name in torch_geometric.nn.models "
            "such as 'GCN', 'GraphSAGE', 'GIN', 'GAT', or a dotted class path."
        ) from err
    if not (isinstance(cls, type) and issubclass(cls, BasicGNN)):
        raise TypeError(
            f"NodeClassifier: `gnn` must name a torch_geometric BasicGNN subclass (got {gnn!r}, a "
            f"{getattr(cls, '__name__', type(cls).__name__)}). Write a LightningModule for other models "
            "(see docs/custom_models.md)."
        )
    return cls


class NodeClassifier(LightningModule):
    """Classify the nodes of one graph with a PyG ``BasicGNN`` and cross-entropy on ``train_mask``.

    An ordinary LightningModule (it trains on a plain ``Trainer`` too); under
    :class:`~lightning_gnnpipe.GNNPipeStrategy` its ``BasicGNN`` is cut into stages. Logs
    ``train_loss``, ``train_acc``, ``val_loss``, ``val_acc``, ``test_loss`` and ``test_acc``; ``predict``
    returns the predicted class of every node ``(|V|,)``.

    Args:
        in_channels: Input feature width ``F`` (the CLI links it from the DataModule).
        out_channels: Number of classes ``C`` (the CLI links it from the DataModule).
        gnn: The ``BasicGNN`` class, see :func:`resolve_gnn`.
        hidden_channels: Hidden width.
        num_layers: Number of message-passing layers ``L``.
        dropout: Dropout probability between layers.
        norm: Norm between layers, a PyG name (``"layer_norm"``, ``"batch_norm"``) or ``None``.
        norm_kwargs: Arguments of the norm, e.g. ``{"mode": "node"}`` for a per-node LayerNorm.
        gnn_kwargs: Other arguments of the GNN class (e.g. ``{"heads": 4}`` for ``GAT``).
        lr: Adam learning rate.
        weight_decay: Adam weight decay.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        gnn: str = "GCN",
        hidden_channels: int = 64,
        num_layers: int = 2,
        dropout: float = 0.5,
        norm: Optional[str] = None,
        norm_kwargs: Optional[Dict[str, Any]] = None,
        gnn_kwargs: Optional[Dict[str, Any]] = None,
        lr: float = 0.01,
        weight_decay: float = 5e-4,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.gnn = resolve_gnn(gnn)(
            in_channels, hidden_channels, num_layers, out_channels, dropout=dropout, norm=norm,
            norm_kwargs=norm_kwargs, **(gnn_kwargs or {}),
        )

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.gnn(x, edge_index)

    def _log_split(self, batch: Any, split: str) -> Tensor:
        mask = getattr(batch, f"{split}_mask")
        out = self(batch.x, batch.edge_index)[mask]
        loss = F.cross_entropy(out, batch.y[mask])
        acc = accuracy(out.argmax(-1), batch.y[mask], task="multiclass", num_classes=self.hparams.out_channels)
        self.log_dict({f"{split}_loss": loss, f"{split}_acc": acc}, batch_size=1, prog_bar=split != "test")
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._log_split(batch, "train")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._log_split(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._log_split(batch, "test")

    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self(batch.x, batch.edge_index).argmax(-1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
