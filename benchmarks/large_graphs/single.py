"""The single CSR process a user runs instead (``exact`` of :mod:`benchmarks.time_to_accuracy.worker`): load the
saved graph, ``ressage8`` full-graph Adam steps with an exact validation after each, its memory sampled::

    python -m benchmarks.large_graphs.single GRAPH.pt EPOCHS OUT.json
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(graph: str, epochs: int, out: Path) -> None:
    import torch

    from benchmarks.harness.memory import MemorySampler, vm_hwm_bytes
    from benchmarks.time_to_accuracy.worker import run_plain

    sampler = MemorySampler(out.with_suffix(".mem.json")).start()
    t0 = time.perf_counter()
    data = torch.load(graph, weights_only=False)
    load_s = time.perf_counter() - t0
    rows = run_plain({"mode": "exact", "model": "ressage8", "seed": 0, "epochs": epochs, "threads": 2}, data)
    peaks = sampler.stop()
    out.write_text(json.dumps({"epochs_rows": rows, "load_s": load_s, "peaks": peaks, "vm_hwm": vm_hwm_bytes()}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
