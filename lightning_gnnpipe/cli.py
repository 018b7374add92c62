"""``lightning-gnnpipe``: the command line, a ``LightningCLI`` over a node classifier and a graph.

Source: Lightning docs, "Configure hyperparameters from the CLI" (``LightningCLI``, 2.6).

    lightning-gnnpipe fit --config examples/configs/cora_gcn.yaml
    lightning-gnnpipe fit --config examples/configs/cora_gcn.yaml --trainer.max_epochs=50 --model.num_layers=8
    lightning-gnnpipe test --config examples/configs/cora_gcn.yaml --ckpt_path=path/to/last.ckpt
    lightning-gnnpipe fit --config examples/configs/cora_gcn.yaml --print_config   # the full config as YAML

Without the console script (e.g. from a clone): ``python -m lightning_gnnpipe.cli ...``.
The subcommands are Lightning's: ``fit``, ``validate``, ``test``, ``predict``, and ``partition``, which cuts a
graph once into the directory :meth:`GraphChunkDataModule.from_partitions
<lightning_gnnpipe.GraphChunkDataModule.from_partitions>` loads (:mod:`lightning_gnnpipe.data.partitioned.command`).
The model is
:class:`~lightning_gnnpipe.models.NodeClassifier`, the data
:class:`~lightning_gnnpipe.datasets.PlanetoidChunkDataModule`; the model's input and
output widths are taken from the data.
"""

from __future__ import annotations

import sys
from typing import List, Optional

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

import lightning_gnnpipe  # noqa: F401  (registers strategy="gnnpipe")
from lightning_gnnpipe.datasets import PlanetoidChunkDataModule
from lightning_gnnpipe.models import NodeClassifier


class GNNPipeCLI(LightningCLI):
    """``LightningCLI`` that links the model's widths to the graph."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.num_features", "model.in_channels", apply_on="instantiate")
        parser.link_arguments("data.num_classes", "model.out_channels", apply_on="instantiate")


def main(args: Optional[List[str]] = None) -> None:
    """Run the CLI on ``args`` (default: ``sys.argv[1:]``)."""
    argv = sys.argv[1:] if args is None else args
    if argv[:1] == ["partition"]:
        from lightning_gnnpipe.data.partitioned.command import main as partition

        partition(argv[1:])
        return
    GNNPipeCLI(NodeClassifier, PlanetoidChunkDataModule, args=args, save_config_kwargs={"overwrite": True},
               parser_kwargs={"description": "Lightning's subcommands over a node classifier and a graph; and "
                                             "`lightning-gnnpipe partition --help`: cut a graph once for "
                                             "GraphChunkDataModule.from_partitions."})


if __name__ == "__main__":  # the spawned stage processes import this module; they must not run it
    main()
