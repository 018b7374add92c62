"""A user's training script whose rank 1 fails in epoch 1 (run by ``tests/test_failures.py``).

Usage: ``python -m tests.failing_fit {raise|kill} TIMEOUT_S [spawn|fork]``. It launches the ranks
with the strategy's own launcher, as a user script would: ``spawn`` (the default) or ``fork``,
the same launcher class without re-importing torch in every rank (seconds per launch on a busy
machine; the tests use it). Fork is a test device only: OpenMP after fork can deadlock, so the
ranks run single-threaded here.
"""

import os
import sys
from datetime import timedelta

import torch

from lightning.pytorch import Trainer

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule
from lightning_gnnpipe.strategy.launcher import CheckedMultiProcessingLauncher
from tests.helpers import sbm_graph
from tests.scenarios import FailingGCN


class _ForkLaunchedStrategy(GNNPipeStrategy):
    def make_launcher(self) -> CheckedMultiProcessingLauncher:
        return CheckedMultiProcessingLauncher(self, start_method="fork")


def main(mode: str, timeout_s: float, start_method: str = "spawn") -> None:
    if start_method == "fork":  # before any torch op: no OpenMP thread pool may exist at fork time
        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"
    dm = GraphChunkDataModule(sbm_graph(num_nodes=100), num_chunks=2)
    if start_method == "fork":
        strategy = _ForkLaunchedStrategy(timeout=timedelta(seconds=timeout_s))
    else:
        strategy = GNNPipeStrategy(timeout=timedelta(seconds=timeout_s))
    trainer = Trainer(accelerator="cpu", devices=2, max_epochs=3, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      limit_val_batches=0, strategy=strategy)
    trainer.fit(FailingGCN(16, 16, 2, 4, mode=mode), datamodule=dm)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), *sys.argv[3:4])
