"""bf16-mixed and global-norm clipping against single-device references, on a 400-node SBM graph.

Prints one markdown table: each layout's per-epoch training loss (5 epochs, 4-layer GCN or GCNII of
width 32) and its largest difference from the single-device run with the same precision and clip
value. Not a test (``tests/test_precision.py`` asserts the K = 1, 2-stage cases); run it by hand:

    python -m benchmarks.accuracy.precision
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, GraphParallelStrategy  # noqa: E402
from tests.helpers import ChunkLossGCN, GCNIIModule, GCNModule, fit, losses, sbm_graph  # noqa: E402
from tests.precision_helpers import SGDGCN  # noqa: E402


class PerStageClipping(GNNPipeStrategy):
    """GNNPipe with Lightning's default clipping: each rank clips by its own stage's norm (wrong)."""

    def _training_precision(self, plugin):
        return plugin  # Lightning's own plugin: no all-reduce of the squared norms


def main() -> None:
    graph = sbm_graph(num_nodes=400)
    bf16 = dict(precision="bf16-mixed")
    clip = dict(gradient_clip_val=0.02)
    runs = [  # name, module, chunks, devices, strategy, trainer kwargs, reference name
        ("GCN, 1 device, 32-true", GCNModule, 1, 1, None, {}, None),
        ("GCN, 1 device, bf16-mixed", GCNModule, 1, 1, None, bf16, None),
        ("GCN, GNNPipe 2 stages, K=1, bf16-mixed", GCNModule, 1, 2, GNNPipeStrategy, bf16, 1),
        ("GCN, GNNPipe 2 stages, K=4 1f1b, bf16-mixed", ChunkLossGCN, 4, 2, "1f1b", bf16, 1),
        ("GCN, graph-parallel 2 parts, bf16-mixed", GCNModule, 2, 2, GraphParallelStrategy, bf16, 1),
        ("GCNII, 1 device, bf16-mixed", GCNIIModule, 1, 1, None, bf16, None),
        ("GCNII, GNNPipe 3 stages, K=1, bf16-mixed", GCNIIModule, 1, 3, GNNPipeStrategy, bf16, 5),
        ("GCN SGD, 1 device, clip 0.02", SGDGCN, 1, 1, None, clip, None),
        ("GCN SGD, GNNPipe 2 stages, K=1, clip 0.02 (global norm)", SGDGCN, 1, 2, GNNPipeStrategy, clip, 7),
        ("GCN SGD, GNNPipe 2 stages, K=1, clip 0.02 (per-stage norm)", SGDGCN, 1, 2, PerStageClipping, clip, 7),
        ("GCN SGD, graph-parallel 2 parts, clip 0.02", SGDGCN, 2, 2, GraphParallelStrategy, clip, 7),
    ]
    results = []
    print("| run | loss per epoch | max abs diff vs reference (row) |\n|---|---|---|")
    for name, module_cls, chunks, devices, strategy, kwargs, ref in runs:
        kw = dict(lr=0.5) if module_cls is SGDGCN else {}
        if strategy == "1f1b":
            strategy = GNNPipeStrategy(schedule="1f1b")
        elif strategy is not None:
            strategy = strategy()
        with tempfile.TemporaryDirectory() as tmp:
            ranks = fit(tmp, module_cls(16, 32, 4, 4, **kw), GraphChunkDataModule(graph, num_chunks=chunks),
                        devices=devices, strategy=strategy, epochs=5, **kwargs)
        loss = losses(ranks[-1])
        results.append(loss)
        diff = "" if ref is None else f"{max(abs(a - b) for a, b in zip(loss, results[ref])):.2e} (row {ref})"
        print(f"| {len(results) - 1}: {name} | {' '.join(f'{v:.5f}' for v in loss)} | {diff} |", flush=True)


if __name__ == "__main__":
    main()
