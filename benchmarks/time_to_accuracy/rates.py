"""The emulated link rates: which rate on this machine stands for a GPU cluster's link.

A GPU computes an epoch in about the time its HBM needs for the epoch's bytes (:func:`gpu_epoch_seconds`); this
machine's core needs ``T_cpu`` (the calibration runs of :mod:`benchmarks.time_to_accuracy.bench`). To keep
compute : communication as on GPUs joined by a link of ``B`` Gbit/s, the emulated link gets ``B * T_gpu / T_cpu``
(:func:`derived_rates`).
"""

from __future__ import annotations

from typing import Dict, List

from benchmarks.time_to_accuracy.models import DEPTH

GPU_LINKS_GBIT = (10, 100, 400)  # the clusters whose compute : communication the emulated rates stand for
HBM_BYTES_PER_S = 3.35e12  # H100 SXM (H200: 4.8e12): the GPU the derivation assumes
HBM_EFFICIENCY = 0.6  # fraction of it a sparse-dense matmul and the dense kernels reach (a generous bound)


def median(values: List[float]) -> float:
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else 0.5 * (values[n // 2 - 1] + values[n // 2])


def gpu_epoch_seconds(nodes: int, edges: int, layers: int, width: int = 64) -> float:
    """A lower bound of a GPU's training epoch (seconds): the bytes its kernels move at :data:`HBM_EFFICIENCY` of
    :data:`HBM_BYTES_PER_S`.

    Per layer, forward and backward: two sparse-dense products over the ``|E|`` entries (8-byte index, 4-byte value,
    one gathered row of ``4 d`` bytes each) and about eleven passes over ``|V| x d`` floats (the dense layers' inputs,
    outputs and gradients, the norm and the activation).
    """
    per_layer = 2 * edges * (12 + 4 * width) + 11 * nodes * width * 4
    return layers * per_layer / (HBM_BYTES_PER_S * HBM_EFFICIENCY)


def derived_rates(records: List[dict]) -> Dict[int, dict]:
    """Per GPU link speed (Gbit/s), the emulated rate (bits/s) that keeps the epoch's compute : communication,
    from the calibration runs (the smaller of the models' rates: the stricter link)."""
    rows = {}
    for gbit in GPU_LINKS_GBIT:
        best = None
        for rec in records:
            s = rec["spec"]
            if rec["status"] != "ok" or s["mode"] != "exact" or s.get("threads") != 1:
                continue
            cpu = median([e["train_s"] for e in rec["epochs"][1:]])
            depth = DEPTH[s["model"]]
            gpu = gpu_epoch_seconds(s["graph"]["num_nodes"], rec["num_edges"], depth)
            rate = gbit * 1e9 * gpu / cpu
            if best is None or rate < best["rate_bits"]:
                best = {"rate_bits": rate, "cpu_s": cpu, "gpu_s": gpu, "model": s["model"]}
        if best is not None:
            rows[gbit] = best
    return rows
