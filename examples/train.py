"""Train a deep residual GCN on Cora with GNNPipe on 2 processes (GPUs when there are, else CPU).

Run from the repository root:

    python examples/train.py                      # GNNPipe, 2 processes, 8 chunks
    python examples/train.py --devices 1          # the same model on a plain single-device Trainer
    python examples/train.py --accelerator cpu    # on the CPU even where a GPU exists

It logs to TensorBoard (``tb_logs/``), saves the last checkpoint and prints the final
full-graph test accuracy.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch_geometric.nn import GCNConv
from torchmetrics.functional import accuracy

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule  # noqa: E402
from lightning_gnnpipe.datasets import load_planetoid  # noqa: E402
from lightning_gnnpipe.nn import make_dropout  # noqa: E402  (NodeDropout or nn.Dropout)
from lightning_gnnpipe.nn.stack import BlockStack  # noqa: E402


class InputBlock(nn.Module):
    def __init__(self, in_channels: int, hidden: int, dropout: float, node_dropout: bool = False) -> None:
        super().__init__()
        self.conv, self.drop = GCNConv(in_channels, hidden), make_dropout(dropout, node_dropout)

    def forward(self, x, edge_index):
        return self.conv(self.drop(x), edge_index)


class ResidualBlock(nn.Module):
    """Pre-activation residual GCN layer (DeepGCN 'res+': norm, act, dropout, conv, add)."""

    def __init__(self, hidden: int, dropout: float, node_dropout: bool = False) -> None:
        super().__init__()
        self.norm, self.conv = nn.LayerNorm(hidden), GCNConv(hidden, hidden)
        self.drop = make_dropout(dropout, node_dropout)

    def forward(self, x, edge_index):
        return x + self.conv(self.drop(F.relu(self.norm(x))), edge_index)


class OutputBlock(nn.Module):
    def __init__(self, hidden: int, out_channels: int, dropout: float, node_dropout: bool = False) -> None:
        super().__init__()
        self.norm, self.conv = nn.LayerNorm(hidden), GCNConv(hidden, out_channels)
        self.drop = make_dropout(dropout, node_dropout)

    def forward(self, x, edge_index):
        return self.conv(self.drop(F.relu(self.norm(x))), edge_index)


class DeepResGCN(BlockStack):
    """``num_layers`` GCN layers with residual connections, declared as pipeline blocks.

    ``node_dropout=True`` uses :class:`~lightning_gnnpipe.nn.NodeDropout` (one mask per node and epoch, the same
    in every chunk that reads the node) instead of ``nn.Dropout``.
    """

    def __init__(self, in_channels: int, hidden: int, out_channels: int, num_layers: int, dropout: float,
                 node_dropout: bool = False) -> None:
        super().__init__(
            [InputBlock(in_channels, hidden, dropout, node_dropout)]
            + [ResidualBlock(hidden, dropout, node_dropout) for _ in range(num_layers - 2)]
            + [OutputBlock(hidden, out_channels, dropout, node_dropout)]
        )


class NodeClassifier(LightningModule):
    def __init__(self, in_channels: int, num_classes: int, hidden: int = 64, num_layers: int = 8,
                 dropout: float = 0.5, lr: float = 0.005, weight_decay: float = 5e-4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = DeepResGCN(in_channels, hidden, num_classes, num_layers, dropout)

    def forward(self, x, edge_index):
        return self.model(x, edge_index)

    def training_step(self, batch, batch_idx):
        out = self(batch.x, batch.edge_index)
        loss = F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])
        self.log("train_loss", loss, prog_bar=True, batch_size=1)
        return loss

    def _evaluate(self, batch, mask, prefix):
        out = self(batch.x, batch.edge_index)
        acc = accuracy(out[mask].argmax(-1), batch.y[mask], task="multiclass",
                       num_classes=self.hparams.num_classes)
        self.log(f"{prefix}_acc", acc, prog_bar=True, batch_size=1)
        self.log(f"{prefix}_loss", F.cross_entropy(out[mask], batch.y[mask]), batch_size=1)

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, batch.val_mask, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, batch.test_mask, "test")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="Cora", choices=["Cora", "CiteSeer"])
    p.add_argument("--accelerator", default="auto", choices=["auto", "gpu", "cpu"],
                   help="'auto' (default): one GPU per process where CUDA is available (NCCL), else the CPU (gloo)")
    p.add_argument("--devices", type=int, default=2, help="processes = stages x partitions; 1 = plain Trainer")
    p.add_argument("--graph-parallel-size", type=int, default=1,
                   help="G graph partitions (hybrid parallelism: devices / G stages); 1 = pure GNNPipe")
    p.add_argument("--num-chunks", type=int, default=8, help="graph chunks K (pipeline micro-batches)")
    p.add_argument("--schedule", default="auto", choices=["auto", "gpipe", "1f1b"],
                   help="'auto' (default): 1F1B when the loss is a sum over nodes, else GPipe")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--logdir", default="tb_logs")
    args = p.parse_args()

    seed_everything(args.seed, workers=True)
    data = load_planetoid(args.dataset)
    dm = GraphChunkDataModule(data, num_chunks=args.num_chunks, num_parts=args.graph_parallel_size)
    module = NodeClassifier(data.num_features, int(data.y.max()) + 1, hidden=args.hidden,
                            num_layers=args.layers, lr=args.lr)
    name = f"{args.dataset.lower()}_gnnpipe" if args.devices > 1 else f"{args.dataset.lower()}_single"
    logger = TensorBoardLogger(args.logdir, name=name)
    ckpt = ModelCheckpoint(dirpath=os.path.join(logger.log_dir, "checkpoints"), save_last=True)
    strategy = GNNPipeStrategy(schedule=args.schedule, graph_parallel_size=args.graph_parallel_size) \
        if args.devices > 1 else "auto"
    trainer = Trainer(accelerator=args.accelerator, devices=args.devices, strategy=strategy, max_epochs=args.epochs,
                      logger=logger, callbacks=[ckpt], log_every_n_steps=1, enable_progress_bar=False)
    trainer.fit(module, datamodule=dm)
    result = trainer.test(module, datamodule=dm, verbose=False)[0]
    print(f"final test accuracy ({name}, {args.layers} layers, {args.devices} process(es), "
          f"{args.num_chunks if args.devices > 1 else 1} chunk(s)): {result['test_acc']:.4f}")
    print(f"TensorBoard run: {logger.log_dir}   last checkpoint: {os.path.join(ckpt.dirpath, 'last.ckpt')}")


if __name__ == "__main__":
    main()
