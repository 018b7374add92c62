"""GPU checks of GNNPipe on one CUDA device, in one process (no multi-GPU needed).

Checks, each a row of the printed table and an entry of the JSON written to ``--out``:

* ``stage``: a 2-stage ``GNNStage`` split of a PyG GCN (4 layers, 4 chunks, 300-node SBM graph), tables refreshed,
  every chunk forward, masked cross-entropy backward, on CUDA against the same on the CPU: max abs difference of
  the outputs and of the parameter gradients (tolerance 1e-5);
* ``nccl_fit_k1`` / ``nccl_fit_k4``: ``Trainer(accelerator="gpu", devices=1,
  strategy=GNNPipeStrategy(process_group_backend="nccl"))``, 2 epochs of ``tests.helpers.GCNModule`` on
  ``tests.helpers.sbm_graph(300)``; K = 1 against a plain single-device CPU fit, K = 4 against the same
  GNNPipe fit on the CPU (gloo); per-epoch losses within 1e-4;
* ``bf16_mixed``: the K = 1 CUDA fit under ``precision="bf16-mixed"``: losses finite and within 5e-2 of the
  fp32 CUDA fit (the difference is printed);
* ``scale``: GNNPipe GCN, 8 layers, hidden 64, on ``benchmarks/scale_worker.py::sbm`` with ``--nodes`` nodes
  (default 1M, about 20M directed edges), one process, K = 8: peak ``torch.cuda.max_memory_allocated`` over the
  fit and the epoch seconds (``torch.cuda.synchronize()`` at both ends of each epoch; the last epoch is the
  steady-state figure, the first includes the history refresh and CUDA warm-up).

One process runs everything: the fits use a torchrun-style environment (``WORLD_SIZE=1``, ``LOCAL_RANK=0``), so
the strategy's launcher spawns nothing; each fit starts and destroys its own one-rank process group.

Command (repository root)::

    python3 benchmarks/gpu_check.py [--out benchmarks/results/gpu_check.json] [--nodes 1000000] [--skip-scale]

Time budget: at most 5 minutes on one H200 (most of it is generating and METIS-partitioning the 1M-node graph on
the CPU; the small checks take well under a minute). Without CUDA it prints "CUDA not available: nothing run" and
exits 0, so it is safe to run anywhere. Exit code 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

STAGE_TOL, FIT_TOL, BF16_TOL = 1e-5, 1e-4, 5e-2


def check_stage(device: torch.device) -> dict:
    """Stage forward + backward on ``device`` against the CPU (``tests/test_gpu.py``'s helpers)."""
    from torch_geometric.nn.models import GCN

    from tests.helpers import sbm_graph
    from tests.test_gpu import forward_backward, make_stages_on
    from tests.test_stage import make_stages

    data = sbm_graph(300)
    torch.manual_seed(0)
    gnn = GCN(16, 32, 4, 4).eval()
    plan_c, cpu = make_stages(gnn, data, num_chunks=4, num_stages=2)
    plan_d, dev = make_stages_on(device, gnn, data, num_chunks=4, num_stages=2)
    out_c, grads_c = forward_backward(plan_c, cpu, data, torch.device("cpu"))
    out_d, grads_d = forward_backward(plan_d, dev, data, device)
    out_diff = float((out_d - out_c).abs().max())
    grad_diff = max(float((g - c).abs().max()) for g, c in zip(grads_d, grads_c))
    ok = (plan_c.fingerprint() == plan_d.fingerprint() and len(grads_d) == len(grads_c) > 0
          and max(out_diff, grad_diff) <= STAGE_TOL)
    return dict(ok=ok, out_max_abs_diff=out_diff, grad_max_abs_diff=grad_diff, tol=STAGE_TOL,
                summary=f"out {out_diff:.2e}, grad {grad_diff:.2e} (tol {STAGE_TOL:g})")


def epoch_timer(cuda: bool):
    """A Lightning callback: seconds of every training epoch, with ``torch.cuda.synchronize()`` at both ends."""
    from lightning.pytorch import Callback

    class EpochTimer(Callback):
        def __init__(self) -> None:
            self.seconds: List[float] = []
            self._t0 = 0.0

        def _sync(self) -> None:
            if cuda:
                torch.cuda.synchronize()

        def on_train_epoch_start(self, trainer, pl_module):
            self._sync()
            self._t0 = time.perf_counter()

        def on_train_epoch_end(self, trainer, pl_module):
            self._sync()
            self.seconds.append(time.perf_counter() - self._t0)

    return EpochTimer()


def fit_once(module, datamodule, epochs: int, accelerator: str, backend: Optional[str], precision: str = "32-true",
             **trainer_kwargs) -> dict:
    """One fit in this process: plain single-device when ``backend`` is None, else one-rank GNNPipe.

    Returns the per-epoch ``train_loss``, the epoch seconds and (on CUDA) the peak allocated bytes.
    """
    import torch.distributed as dist
    from lightning.pytorch import Trainer

    from lightning_gnnpipe import GNNPipeStrategy
    from tests.helpers import MetricRecorder, losses
    from tests.world import free_port

    cuda = accelerator == "gpu"
    saved = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK",
                                            "NODE_RANK")}
    timer = epoch_timer(cuda)
    with tempfile.TemporaryDirectory() as directory:
        recorder = MetricRecorder(directory)
        kwargs = dict(accelerator=accelerator, devices=1, max_epochs=epochs, precision=precision, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, callbacks=[recorder, timer])
        kwargs.update(trainer_kwargs)
        if backend is not None:
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="1", RANK="0",
                              LOCAL_RANK="0", NODE_RANK="0")
            kwargs["strategy"] = GNNPipeStrategy(process_group_backend=backend)
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            Trainer(**kwargs).fit(module, datamodule=datamodule)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        out = dict(losses=losses(recorder.epochs), epoch_s=timer.seconds)
    if cuda:
        torch.cuda.synchronize()
        out["peak_bytes"] = int(torch.cuda.max_memory_allocated())
    return out


def max_diff(a: List[float], b: List[float]) -> float:
    if len(a) != len(b) or not a:
        return math.inf
    return max(abs(x - y) for x, y in zip(a, b))


def check_fits(accelerator: str = "gpu", backend: str = "nccl", epochs: int = 2) -> Dict[str, dict]:
    """The small fits: K = 1 and K = 4 on the device against the CPU, and bf16-mixed against fp32."""
    from lightning_gnnpipe import GraphChunkDataModule
    from tests.helpers import GCNModule, sbm_graph

    graph = sbm_graph(300)
    module = lambda: GCNModule(16, 32, 4, 4)  # noqa: E731
    dm1, dm4 = GraphChunkDataModule(graph, num_chunks=1), GraphChunkDataModule(graph, num_chunks=4)
    results = {}
    plain = fit_once(module(), dm1, epochs, "cpu", None)
    dev1 = fit_once(module(), dm1, epochs, accelerator, backend)
    d = max_diff(dev1["losses"], plain["losses"])
    results["nccl_fit_k1"] = dict(ok=d <= FIT_TOL, max_abs_diff=d, tol=FIT_TOL, losses=dev1["losses"],
                                  reference=plain["losses"], reference_kind="plain single-device CPU fit",
                                  summary=f"vs plain CPU: {d:.2e} (tol {FIT_TOL:g})")
    cpu4 = fit_once(module(), dm4, epochs, "cpu", "gloo")
    dev4 = fit_once(module(), dm4, epochs, accelerator, backend)
    d = max_diff(dev4["losses"], cpu4["losses"])
    results["nccl_fit_k4"] = dict(ok=d <= FIT_TOL, max_abs_diff=d, tol=FIT_TOL, losses=dev4["losses"],
                                  reference=cpu4["losses"], reference_kind="GNNPipe K=4 CPU (gloo) fit",
                                  summary=f"vs GNNPipe CPU: {d:.2e} (tol {FIT_TOL:g})")
    bf16 = fit_once(module(), dm1, epochs, accelerator, backend, precision="bf16-mixed")
    d = max_diff(bf16["losses"], dev1["losses"])
    finite = bool(bf16["losses"]) and all(math.isfinite(x) for x in bf16["losses"])
    results["bf16_mixed"] = dict(ok=finite and d <= BF16_TOL, finite=finite, max_abs_diff=d, tol=BF16_TOL,
                                 losses=bf16["losses"], reference=dev1["losses"],
                                 summary=f"finite={finite}, vs fp32: {d:.2e} (tol {BF16_TOL:g})")
    return results


def check_scale(nodes: int, epochs: int = 3, accelerator: str = "gpu", backend: str = "nccl",
                chunks: int = 8) -> dict:
    """GNNPipe GCN 8 x 64 on the scale benchmark's SBM graph, one process, K = ``chunks``."""
    from torch_geometric.nn.models import GCN

    from lightning_gnnpipe import GraphChunkDataModule
    from scale_worker import sbm
    from tests.helpers import GNNModule

    t0 = time.perf_counter()
    data = sbm(nodes)  # 64 blocks, degree 20, 64 features, 8 classes
    graph_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    dm = GraphChunkDataModule(data, num_chunks=chunks)
    plan_s = time.perf_counter() - t0
    torch.manual_seed(0)
    module = GNNModule(GCN(data.num_features, 64, 8, int(data.y.max()) + 1))
    t0 = time.perf_counter()
    run = fit_once(module, dm, epochs, accelerator, backend, limit_val_batches=0)
    fit_s = time.perf_counter() - t0
    finite = bool(run["losses"]) and all(math.isfinite(x) for x in run["losses"])
    peak = run.get("peak_bytes")
    out = dict(ok=finite and len(run["epoch_s"]) == epochs, nodes=nodes, edges=int(data.edge_index.size(1)),
               chunks=chunks, layers=8, hidden=64, epochs=epochs, epoch_s=run["epoch_s"], losses=run["losses"],
               peak_bytes=peak, graph_s=graph_s, plan_s=plan_s, fit_s=fit_s)
    mem = f"peak {peak / 2**30:.2f} GiB, " if peak is not None else ""
    out["summary"] = (f"{nodes} nodes / {out['edges']} edges: {mem}epoch {run['epoch_s'][-1]:.2f} s "
                      f"(first {run['epoch_s'][0]:.2f} s)")
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_check.json"),
                        help="JSON results file (default: benchmarks/results/gpu_check.json)")
    parser.add_argument("--nodes", type=int, default=1_000_000, help="nodes of the scale check (default 1M)")
    parser.add_argument("--scale-epochs", type=int, default=3, help="epochs of the scale check (default 3)")
    parser.add_argument("--skip-scale", action="store_true", help="run only the small checks")
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        print("CUDA not available: nothing run")
        return 0

    import warnings

    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    results: Dict[str, dict] = {}

    def guarded(name: str, fn, *a, **k):
        t0 = time.perf_counter()
        try:
            got = fn(*a, **k)
        except Exception as exc:  # record and go on: one broken check must not hide the others
            got = {name: dict(ok=False, error=f"{type(exc).__name__}: {exc}", summary=f"ERROR {type(exc).__name__}")}
        else:
            got = got if name == "fits" else {name: got}
        for v in got.values():
            v.setdefault("seconds", time.perf_counter() - t0)
        results.update(got)

    guarded("stage", check_stage, torch.device("cuda"))
    guarded("fits", check_fits)
    if not args.skip_scale:
        guarded("scale", check_scale, args.nodes, args.scale_epochs)

    report = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, total_s=time.perf_counter() - start,
                  all_ok=all(r["ok"] for r in results.values()), checks=results)
    print(f"{'check':<12} {'ok':<5} {'s':>6}  result")
    for name, r in results.items():
        print(f"{name:<12} {str(r['ok']):<5} {r['seconds']:>6.1f}  {r['summary']}")
    print(f"device {report['device']}, total {report['total_s']:.1f} s, all ok: {report['all_ok']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if report["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
