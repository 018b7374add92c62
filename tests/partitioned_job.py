"""A user's script under torchrun, training from a partitioned graph: ``tests/test_partitioned.py`` starts two
agents (``--nnodes 2``) with ``python -m torch.distributed.run ... partitioned_job.py PARTS OUT``."""

import sys
from pathlib import Path


def strategy():
    from lightning_gnnpipe import GNNPipeStrategy

    return GNNPipeStrategy(graph_parallel_size=2, schedule="1f1b")


if __name__ == "__main__":
    from lightning.pytorch import Trainer

    from lightning_gnnpipe import GraphChunkDataModule
    from tests.helpers import MetricRecorder
    from tests.test_exactness import SaveWeights, SGDChunkLossGCN
    from tests.test_sgd import EPOCHS, LR, MODEL

    parts, out = sys.argv[1], Path(sys.argv[2])
    trainer = Trainer(accelerator="cpu", num_nodes=2, devices=1, strategy=strategy(), max_epochs=EPOCHS,
                      limit_val_batches=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0,
                      callbacks=[MetricRecorder(str(out)), SaveWeights(out / "weights.ckpt")])
    trainer.fit(SGDChunkLossGCN(*MODEL, lr=LR), datamodule=GraphChunkDataModule.from_partitions(parts))
