"""A user's training script on one emulated machine, started by torchrun (``benchmarks/large_graphs/bench.py``)::

    python -m torch.distributed.run --nnodes M --nproc-per-node 1 --node-rank r --master-addr 127.0.0.1 \\
        --master-port P benchmarks/large_graphs/job.py PARTS MODE EPOCHS OUT

It trains ``ressage8`` (:mod:`benchmarks.time_to_accuracy.models`) from the partitioned graph ``PARTS`` with
``MODE`` ``hybrid`` (``GNNPipeStrategy(graph_parallel_size=G)``, ``M / G`` stages) or ``graph_parallel``
(``GraphParallelStrategy``), validating after every epoch, and writes per rank ``OUT/epochs_rank<r>.json`` and
``OUT/mem_rank<r>.json`` (:class:`benchmarks.time_to_accuracy.worker.Epochs`) and ``OUT/agent_rank<r>.json``: the
USS/RSS of its torchrun agent, the process that launched it.
"""

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(parts: str, mode: str, epochs: int, out: Path) -> None:
    import psutil
    from lightning.pytorch import Trainer

    from benchmarks.time_to_accuracy.models import LEARNING_RATE, Classifier, build_model
    from benchmarks.time_to_accuracy.worker import Epochs
    from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, GraphParallelStrategy

    out.mkdir(parents=True, exist_ok=True)
    dm = GraphChunkDataModule.from_partitions(parts)
    meta = dm.partitions.meta
    long = timedelta(hours=2)
    if mode == "hybrid":
        strategy = GNNPipeStrategy(graph_parallel_size=dm.num_parts, timeout=long, exchange_timeout=long)
    else:
        strategy = GraphParallelStrategy(timeout=long, exchange_timeout=long)
    module = Classifier(build_model("ressage8", meta["num_features"], 8, 0), LEARNING_RATE["ressage8"])
    nodes = int(os.environ["WORLD_SIZE"])
    trainer = Trainer(accelerator="cpu", num_nodes=nodes, devices=1, strategy=strategy, max_epochs=epochs,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, callbacks=[Epochs(out)])
    trainer.fit(module, datamodule=dm)
    agent = psutil.Process(os.getppid()).memory_full_info()
    (out / f"agent_rank{trainer.global_rank}.json").write_text(json.dumps({"uss": agent.uss, "rss": agent.rss}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
