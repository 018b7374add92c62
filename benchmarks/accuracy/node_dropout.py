"""Cost of NodeDropout against nn.Dropout, one CPU thread: the operation alone and a chunked training epoch.

    python -m benchmarks.accuracy.node_dropout

Prints the best of repeated timings (seconds, milliseconds) of ``F.dropout`` and ``NodeDropout`` (p = 0.5) on
CiteSeer-sized inputs ``(3327, 64)`` and ``(3327, 3703)`` (hidden width and raw features), and of one training
epoch (forward and backward, no optimizer step) of the benchmark's CiteSeer ResGCN-4 chunked into K = 8 chunks
(``benchmarks/accuracy/run.py``'s runner) and on the full graph, with ``nn.Dropout`` and with ``NodeDropout``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import benchmarks.accuracy.run as A  # noqa: E402  (benchmarks/accuracy/run.py: datasets, models, chunked runner)
from lightning_gnnpipe.nn import NodeDropout, node_rows  # noqa: E402


def best(fn: Callable[[], object], repeats: int) -> float:
    """Return the smallest wall time of ``repeats`` calls of ``fn`` (seconds)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    torch.set_num_threads(1)
    print("| input | F.dropout (ms) | NodeDropout (ms) | ratio |\n|---|---|---|---|")
    for rows, width in [(3327, 64), (3327, 3703)]:
        x, ids, drop = torch.randn(rows, width), torch.arange(rows), NodeDropout(0.5).train()

        def hashed():
            with node_rows(ids, 3):
                drop(x)

        plain, node = best(lambda: F.dropout(x, 0.5, True), 20), best(hashed, 20)
        print(f"| ({rows}, {width}) | {plain * 1e3:.1f} | {node * 1e3:.1f} | {node / plain:.2f} |")
    data = A.DATASETS["CiteSeer"]()
    classes = int(data.y.max()) + 1
    print("\n| CiteSeer ResGCN-4 | chunked epoch, K = 8 (s) | full-graph epoch (s) |\n|---|---|---|")
    for name, label in [("resgcn4", "nn.Dropout"), ("resgcn4-nodedrop", "NodeDropout")]:
        torch.manual_seed(0)
        model = A.MODELS[name](data.num_features, classes).train()
        plan, stage = A.chunked_stage(data, model, 8, "greedy")

        def chunked():
            stage.next_epoch()
            A.chunked_forward(plan, stage, data.x, classes)[data.train_mask].sum().backward()

        def full():
            model(data.x, data.edge_index)[data.train_mask].sum().backward()

        print(f"| {label} | {best(chunked, 10):.3f} | {best(full, 10):.3f} |")


if __name__ == "__main__":
    main()
