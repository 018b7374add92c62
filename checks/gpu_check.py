"""GPU check of lightning_gnnpipe: what the CPU test suite cannot settle, in one run, as PASS/FAIL lines.

One GPU (each fit is a one-rank NCCL fit in this process, torchrun-style environment, under the wire check of
``tests/wire.py``: every tensor handed to ``torch.distributed`` contiguous, on ``cuda:0``, of an NCCL dtype):

* ``fit_gnnpipe_gpipe``: GNNPipe, GPipe, K = 4, a residual GCN with ``NodeDropout`` (``examples/train.py``'s
  ``DeepResGCN``) and gradient clipping; ``fit_gnnpipe_1f1b``: 1F1B with ``pipeline_chunk_loss``; ``fit_zbv``: two
  local stages on one rank (``schedule="zbv"``); ``fit_graph_parallel``: ``GraphParallelStrategy``. Each against the
  same fit on the CPU with gloo: per-epoch losses within 1e-4 (``NodeDropout``'s masks do not depend on the device);
* ``fit_bf16``: the GPipe fit under ``precision="bf16-mixed"``: losses finite and within 5e-2 of the fp32 CUDA fit;
* ``resume``: dropout (CUDA generator), history tables saved with ``torch.distributed.checkpoint`` from the GPU; a
  fit resumed after epoch 1 against the uninterrupted one (within 1e-5; bit for bit is reported);
* ``boundary_tensors``: what a 2-stage split sends forward (stage 0's output) and back (stage 1's input gradient)
  for one chunk, fp32 and bf16-mixed: shape ``(M, d)``, dtype, contiguous, on the GPU;
* ``host_syncs``: ``torch.cuda.set_sync_debug_mode("warn")`` around one micro-batch (forward of both stages and
  backward, after one warm-up micro-batch): no synchronising CUDA call;
* ``deterministic``: ``Trainer(deterministic=True)`` GNNPipe fit twice: bit-identical losses and weights.

Two or more GPUs: ``nccl2_gnnpipe``, ``nccl2_graph_parallel``, ``nccl2_hybrid`` (2 stages x 2 partitions with 4
GPUs, else 1 x 2): multi-process NCCL fits (fresh processes, one GPU each, under the wire check) against the same
layout on gloo; losses within 1e-4. Two NCCL ranks cannot share one GPU (NCCL stops with "Duplicate GPU
detected"), so with one GPU these print SKIP.

Command (repository root; ``pip install -e ".[test]"``, it uses the test helpers)::

    python -m checks.gpu_check [--out checks/gpu_check.json] [--scale [--nodes 1000000]]

About a minute or two on one GPU (no measurement yet); ``--scale`` adds the peak CUDA memory and epoch time of GNNPipe
on a 1M-node graph (graph generation and METIS on the CPU take most of it). Without a CUDA device it runs the CPU
side of the first check, prints ``no CUDA device: ...`` and exits 0. Exit code 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FIT_TOL, BF16_TOL, RESUME_TOL = 1e-4, 5e-2, 1e-5
EPOCHS = 3


class NoCuda(Exception):
    """Raised where a check needs CUDA and there is none: the run stops there."""


@dataclass
class Result:
    """One line of the report."""

    name: str
    status: str  # PASS, FAIL or SKIP
    detail: str
    data: Dict[str, Any] = field(default_factory=dict)

    @property
    def line(self) -> str:
        return f"{self.status} {self.name}: {self.detail}"


@dataclass
class Context:
    """Where the checks run: ``device`` (``cuda:0``, or the CPU when a test runs the checks there) and its backend.

    ``cpu_side`` fits are the references (CPU, gloo); ``needs_cuda`` stops the run when there is no GPU.
    """

    device: torch.device
    backend: str
    require_cuda: bool = True
    graph: Any = None

    @property
    def accelerator(self) -> str:
        return "gpu" if self.device.type == "cuda" else "cpu"

    def needs_cuda(self, step: str) -> None:
        if self.require_cuda and not torch.cuda.is_available():
            raise NoCuda(step)


def compare(name: str, got: List[float], ref: List[float], tol: float, what: str, wire: Optional[dict] = None,
            exact_note: bool = False) -> Result:
    """PASS when both runs have the same number of finite losses and differ by at most ``tol`` per epoch."""
    finite = bool(got) and all(math.isfinite(x) for x in got)
    diff = max((abs(a - b) for a, b in zip(got, ref)), default=math.inf) if len(got) == len(ref) else math.inf
    ok = finite and diff <= tol
    detail = f"{what}, {len(got)} epochs: max |loss diff| {diff:.1e} (tol {tol:.0e})"
    if exact_note:
        detail += ", bit for bit" if got == ref else ", not bit for bit"
    if wire is not None:
        detail += f"; wire: {sum(wire['calls'].values())} calls checked"
    return Result(name, "PASS" if ok else "FAIL", detail, dict(losses=got, reference=ref, max_abs_diff=diff))


# ---------------------------------------------------------------------------------------------- fits
def fit_spec(name: str, graph) -> Dict[str, Any]:
    """Keyword arguments of ``tests.scenarios.fit_rank`` for a one-rank fit of check ``name`` (without the device)."""
    from examples.train import DeepResGCN
    from lightning_gnnpipe import GraphChunkDataModule, GraphParallelStrategy
    from tests.helpers import ChunkLossGCN, GCNModule, GNNModule
    from tests.scenarios import DropoutGCN

    def resgcn():
        torch.manual_seed(0)
        return GNNModule(DeepResGCN(16, 32, 4, 4, dropout=0.3, node_dropout=True))

    dm = lambda k: GraphChunkDataModule(graph, num_chunks=k)  # noqa: E731
    specs = {
        "gnnpipe_gpipe": dict(module=resgcn, datamodule=dm(4), gradient_clip_val=0.5,
                              strategy_kwargs={"schedule": "gpipe"}),
        "gnnpipe_1f1b": dict(module=lambda: ChunkLossGCN(16, 32, 4, 4), datamodule=dm(4),
                             strategy_kwargs={"schedule": "1f1b"}),
        "zbv": dict(module=lambda: ChunkLossGCN(16, 32, 4, 4), datamodule=dm(4),
                    strategy_kwargs={"schedule": "zbv", "stages_per_rank": 2}),
        "graph_parallel": dict(module=lambda: GCNModule(16, 32, 4, 4), datamodule=dm(1),
                               strategy_cls=GraphParallelStrategy),
        "resume": dict(module=lambda: DropoutGCN(16, 32, 4, 4), datamodule=dm(4),
                       strategy_kwargs={"save_history": True}),
    }
    return specs[name]


def one_rank(runs: List[Dict[str, Any]], ctx: Context) -> Dict[str, Any]:
    """Run ``runs`` (``fit_rank`` keyword arguments) as one-rank fits in this process under the wire check."""
    import torch.distributed as dist

    from tests.wire import wire_job
    from tests.world import free_port

    keys = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="1", RANK="0",
                      LOCAL_RANK="0", NODE_RANK="0")
    try:
        return wire_job(runs, ctx.device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(spec: Dict[str, Any], accelerator: str, backend: str, epochs: int = EPOCHS, **extra: Any) -> Dict[str, Any]:
    """One ``fit_rank`` run of ``spec`` on ``accelerator`` with ``backend`` (a fresh module)."""
    out = {k: v for k, v in spec.items() if k != "module"}
    out.update(module=spec["module"](), devices=1, epochs=epochs, accelerator=accelerator, **extra)
    out["strategy_kwargs"] = {**spec.get("strategy_kwargs", {}), "process_group_backend": backend}
    return out


def check_fit(name: str, ctx: Context) -> Result:
    """One-rank fit on ``ctx.device`` against the same fit on the CPU with gloo (SKIP for a schedule this torch cannot
    run, with the reason the strategy gives)."""
    from lightning_gnnpipe.pipeline.schedule import unavailable

    spec = fit_spec(name, ctx.graph)
    why = unavailable(spec.get("strategy_kwargs", {}).get("schedule", ""))
    if why is not None:
        return Result(f"fit_{name}", "SKIP", why)
    ref = one_rank([run(spec, "cpu", "gloo")], Context(torch.device("cpu"), "gloo"))["fits"][0]["losses"]
    ctx.needs_cuda(f"fit_{name} on CUDA with NCCL (its CPU/gloo reference ran: losses {[round(x, 6) for x in ref]})")
    got = one_rank([run(spec, ctx.accelerator, ctx.backend)], ctx)
    return compare(f"fit_{name}", got["fits"][0]["losses"], ref, FIT_TOL,
                   f"{ctx.backend} on {ctx.device} vs gloo on the CPU", got["wire"])


def check_bf16(ctx: Context) -> Result:
    ctx.needs_cuda("fit_bf16")
    spec = fit_spec("gnnpipe_gpipe", ctx.graph)
    out = one_rank([run(spec, ctx.accelerator, ctx.backend), run(spec, ctx.accelerator, ctx.backend,
                                                                 precision="bf16-mixed")], ctx)
    fp32, bf16 = (f["losses"] for f in out["fits"])
    return compare("fit_bf16", bf16, fp32, BF16_TOL, f"bf16-mixed vs fp32 on {ctx.device}", out["wire"])


def check_resume(ctx: Context, directory: str) -> Result:
    """Dropout and history tables on the device: the resumed fit continues as the uninterrupted one."""
    ctx.needs_cuda("resume")
    spec = fit_spec("resume", ctx.graph)
    ckpt = os.path.join(directory, "resume")
    out = one_rank([run(spec, ctx.accelerator, ctx.backend, ckpt_dir=ckpt),
                    run(spec, ctx.accelerator, ctx.backend, ckpt_path=os.path.join(ckpt, "epoch=0.ckpt"))], ctx)
    full, resumed = (f["losses"] for f in out["fits"])
    tables = sorted(os.listdir(os.path.join(ckpt, "epoch=0.ckpt.history")))
    result = compare("resume", resumed, full[1:], RESUME_TOL, f"resumed after epoch 0 on {ctx.device}", out["wire"],
                     exact_note=True)
    if tables != [".metadata", "__0_0.distcp"]:
        result.status, result.detail = "FAIL", result.detail + f"; tables directory holds {tables}"
    return result


def check_deterministic(ctx: Context) -> Result:
    """``Trainer(deterministic=True)`` twice: the same losses and weights, bit for bit."""
    ctx.needs_cuda("deterministic")
    spec = fit_spec("gnnpipe_1f1b", ctx.graph)
    try:
        out = one_rank([run(spec, ctx.accelerator, ctx.backend, deterministic=True) for _ in range(2)], ctx)
    finally:
        torch.use_deterministic_algorithms(False)
    a, b = out["fits"]
    same_state = a["state"].keys() == b["state"].keys() and all(torch.equal(a["state"][k], b["state"][k])
                                                                 for k in a["state"])
    ok = a["losses"] == b["losses"] and same_state
    return Result("deterministic", "PASS" if ok else "FAIL",
                  f"two fits on {ctx.device} with Trainer(deterministic=True): losses "
                  f"{'equal' if a['losses'] == b['losses'] else 'differ'} bit for bit, weights "
                  f"{'equal' if same_state else 'differ'}", dict(losses=[a["losses"], b["losses"]]))


# ---------------------------------------------------------------------------------------------- one stage pair
def two_stages(ctx: Context, bf16: bool = False):
    """Stages 0 and 1 of a 2-stage split of ``DeepResGCN`` (sparse path, as the strategy builds them) on the
    device, wrapped as the pipeline wraps them under bf16-mixed; returns ``(stage0, stage1, plan, autocast)``."""
    from examples.train import DeepResGCN
    from lightning_gnnpipe import GraphChunkDataModule, find_layer_stack
    from lightning_gnnpipe.nn.stack import infer_dims
    from lightning_gnnpipe.pipeline.boundary import BoundaryCast
    from lightning_gnnpipe.pipeline.runtime import PipelineRuntime, RankLayout
    from lightning_gnnpipe.pipeline.split import split_layers
    from lightning_gnnpipe.comm.accounting import CommStats

    torch.manual_seed(0)
    model = DeepResGCN(16, 32, 4, 4, dropout=0.3, node_dropout=True).to(ctx.device).train()
    plan = GraphChunkDataModule(ctx.graph, num_chunks=4).plan
    blocks = find_layer_stack(model).blocks
    x = ctx.graph.x.to(ctx.device)
    dims = infer_dims(blocks, x[:2])
    boundary = torch.bfloat16 if bf16 else x.dtype
    runtime = PipelineRuntime(blocks, split_layers(len(blocks), 2), dims, plan, ctx.graph.edge_index, x,
                              RankLayout([0, 1], [0, 0], 0, [0]), ctx.device, CommStats(), boundary_dtype=boundary)
    s0, s1 = runtime.stages
    if bf16:
        s0, s1 = BoundaryCast(s0, x.dtype, boundary), BoundaryCast(s1, x.dtype, x.dtype)
    autocast = torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=bf16)
    return s0, s1, plan, autocast


def micro_batch(s0, s1, plan, autocast, c: int, device: torch.device):
    """Chunk ``c`` through both stages and back, as the schedule runs it; return what crosses the boundary."""
    chunk = torch.tensor([c])  # on the CPU, as the runtime passes it
    with autocast:
        sent = s0(torch.zeros(1, 16, device=device), chunk_id=chunk)  # the first stage reads its rows of x
        received = sent.detach().requires_grad_(True)  # stage 1's receive buffer
        out = s1(received, chunk_id=chunk)
    out.float().sum().backward()
    return sent, received.grad, plan.max_chunk_size


def check_boundary(ctx: Context) -> Result:
    ctx.needs_cuda("boundary_tensors")
    problems, seen = [], []
    for bf16 in (False, True):
        s0, s1, plan, autocast = two_stages(ctx, bf16)
        sent, grad, rows = micro_batch(s0, s1, plan, autocast, 1, ctx.device)
        dtype = torch.bfloat16 if bf16 else torch.float32
        for what, t in (("activation", sent), ("gradient", grad)):
            seen.append(f"{what} {tuple(t.shape)} {str(t.dtype).replace('torch.', '')}")
            wrong = t is None or t.shape != (rows, 32) or t.dtype != dtype or t.device != ctx.device
            if wrong or not t.is_contiguous():
                problems.append(f"{what} ({'bf16' if bf16 else 'fp32'}): shape {None if t is None else tuple(t.shape)}"
                                f", dtype {None if t is None else t.dtype}, contiguous "
                                f"{None if t is None else t.is_contiguous()}, device {None if t is None else t.device}")
    detail = f"2-stage split, chunk 1, fp32 and bf16-mixed: {'; '.join(seen)}; all contiguous on {ctx.device}"
    return Result("boundary_tensors", "FAIL" if problems else "PASS", "; ".join(problems) if problems else detail)


def check_host_syncs(ctx: Context) -> Result:
    """No synchronising CUDA call inside one micro-batch (forward of both stages and backward)."""
    ctx.needs_cuda("host_syncs")
    if ctx.device.type != "cuda":
        return Result("host_syncs", "SKIP", "torch.cuda.set_sync_debug_mode needs a CUDA device")
    s0, s1, plan, autocast = two_stages(ctx)
    micro_batch(s0, s1, plan, autocast, 0, ctx.device)  # warm-up: lazy initialisation may synchronise
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            micro_batch(s0, s1, plan, autocast, 1, ctx.device)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message).lower()]
    detail = f"{len(syncs)} synchronising CUDA call(s) in one micro-batch (fwd both stages + bwd)"
    if syncs:
        detail += ": " + " | ".join(sorted(set(syncs))[:3])
    return Result("host_syncs", "FAIL" if syncs else "PASS", detail, dict(syncs=syncs))


# ---------------------------------------------------------------------------------------------- several GPUs
def multi_gpu_specs(graph, gpus: int) -> Dict[str, tuple]:
    """``name -> (processes, fit_rank keyword arguments)`` of the multi-process checks."""
    from examples.train import DeepResGCN
    from lightning_gnnpipe import GraphChunkDataModule, GraphParallelStrategy
    from tests.helpers import GCNModule, GNNModule

    torch.manual_seed(0)
    res = GNNModule(DeepResGCN(16, 32, 4, 4, dropout=0.3, node_dropout=True))
    hybrid = (4, 8) if gpus >= 4 else (2, 4)  # processes, chunks: 2 stages x 2 partitions, else 1 x 2
    return {
        "nccl2_gnnpipe": (2, dict(module=res, datamodule=GraphChunkDataModule(graph, num_chunks=4))),
        "nccl2_graph_parallel": (2, dict(module=GCNModule(16, 32, 4, 4), strategy_cls=GraphParallelStrategy,
                                         datamodule=GraphChunkDataModule(graph, num_chunks=2))),
        "nccl2_hybrid": (hybrid[0], dict(module=GCNModule(16, 32, 4, 4), strategy_kwargs={"graph_parallel_size": 2},
                                         datamodule=GraphChunkDataModule(graph, num_chunks=hybrid[1], num_parts=2))),
    }


def check_multi_gpu(ctx: Context, gpus: int, side: tuple = ("gpu", "nccl"),
                    names: Optional[List[str]] = None) -> List[Result]:
    """The multi-process fits (``names``: default all) on ``side`` (accelerator, backend) against gloo on the CPU,
    in spawned processes (a fresh interpreter per rank: CUDA cannot be used in a process forked after it started)."""
    from tests.wire import wire_job
    from tests.world import run_world, values

    specs = {k: v for k, v in multi_gpu_specs(ctx.graph, gpus).items() if names is None or k in names}
    if gpus < 2:
        why = "two NCCL ranks cannot share one GPU (NCCL stops with 'Duplicate GPU detected')"
        return [Result(name, "SKIP", f"needs {procs} GPUs (found {gpus}): {why}") for name, (procs, _) in specs.items()]
    results = []
    for name, (procs, spec) in specs.items():
        def make(accelerator: str, backend: str) -> Dict[str, Any]:
            kwargs = {**spec, "devices": procs, "epochs": EPOCHS, "accelerator": accelerator}
            kwargs["strategy_kwargs"] = {**spec.get("strategy_kwargs", {}), "process_group_backend": backend}
            return kwargs

        try:
            ref = values(run_world(procs, wire_job, [make("cpu", "gloo")], start_method="spawn", timeout=300))
            got = values(run_world(procs, wire_job, [make(*side)], start_method="spawn", timeout=300))
        except AssertionError as exc:  # a rank failed: its last error line
            errors = [line for line in str(exc).splitlines() if line and not line.startswith((" ", "Traceback"))]
            results.append(Result(name, "FAIL", errors[-1] if errors else "a rank failed"))
            continue
        results.append(compare(name, got[0]["fits"][0]["losses"], ref[0]["fits"][0]["losses"], FIT_TOL,
                               f"{procs} processes, {side[1]} on {side[0]} vs gloo on the CPU", got[0]["wire"]))
    return results


# ---------------------------------------------------------------------------------------------- scale (optional)
def check_scale(ctx: Context, nodes: int, epochs: int = 3, chunks: int = 8) -> Result:
    """GNNPipe GCN 8 x 64 on the scale benchmark's SBM graph, one process, K = ``chunks``: peak memory, epoch time."""
    from torch_geometric.nn.models import GCN

    from lightning_gnnpipe import GraphChunkDataModule
    from benchmarks.scale.graph import sbm
    from tests.helpers import GNNModule

    ctx.needs_cuda("scale")
    data = sbm(nodes)  # 64 blocks, degree 20, 64 features, 8 classes
    dm = GraphChunkDataModule(data, num_chunks=chunks)
    torch.manual_seed(0)
    spec = dict(module=lambda: GNNModule(GCN(data.num_features, 64, 8, int(data.y.max()) + 1)), datamodule=dm,
                limit_val_batches=0)
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = one_rank([run(spec, ctx.accelerator, ctx.backend, epochs=epochs)], ctx)["fits"][0]
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated()
    finite = all(math.isfinite(x) for x in out["losses"]) and len(out["losses"]) == epochs
    return Result("scale", "PASS" if finite else "FAIL",
                  f"{nodes} nodes, {int(data.edge_index.size(1))} edges, GCN 8 x 64, K = {chunks}: peak "
                  f"{peak / 2**30:.2f} GiB allocated, {epochs} epochs in {seconds:.1f} s", dict(peak_bytes=peak))


# ---------------------------------------------------------------------------------------------- main
def one_gpu_checks(ctx: Context, directory: str) -> List[tuple]:
    """``(name, check)`` of the one-GPU checks in order; the first needs CUDA only after its CPU reference ran."""
    fits = [(f"fit_{name}", lambda name=name: check_fit(name, ctx))
            for name in ("gnnpipe_gpipe", "gnnpipe_1f1b", "zbv", "graph_parallel")]
    return fits + [("fit_bf16", lambda: check_bf16(ctx)), ("resume", lambda: check_resume(ctx, directory)),
                   ("boundary_tensors", lambda: check_boundary(ctx)), ("host_syncs", lambda: check_host_syncs(ctx)),
                   ("deterministic", lambda: check_deterministic(ctx))]


def run_checks(checks: List[tuple], report: Callable[[Result], None]) -> Optional[str]:
    """Run the ``(name, check)`` pairs in order; return the step where CUDA was missing (``None``: every one ran)."""
    for name, check in checks:
        try:
            got = check()
        except NoCuda as stop:
            return str(stop)
        except Exception as exc:  # one broken check must not hide the others
            got = Result(name, "FAIL", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        for result in got if isinstance(got, list) else [got]:
            report(result)
    return None


def main(argv: Optional[List[str]] = None) -> int:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "checks" / "gpu_check.json"),
                        help="JSON results file (default: checks/gpu_check.json)")
    parser.add_argument("--scale", action="store_true", help="also the 1M-node peak memory and epoch time")
    parser.add_argument("--nodes", type=int, default=1_000_000, help="nodes of the --scale check (default 1M)")
    args = parser.parse_args(argv)

    # cuBLAS reads its workspace setting once; deterministic mode needs this one (set before any CUDA work).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    warnings.filterwarnings("ignore")
    from tests.helpers import sbm_graph

    cuda = torch.cuda.is_available()
    gpus = torch.cuda.device_count() if cuda else 0
    ctx = Context(torch.device("cuda", 0) if cuda else torch.device("cpu"), "nccl", graph=sbm_graph(300))
    print(f"gpu_check: torch {torch.__version__}, {gpus} CUDA device(s)"
          + (f" ({torch.cuda.get_device_name(0)})" if cuda else ""), flush=True)
    start, results = time.perf_counter(), []

    def report(result: Result) -> None:
        results.append(result)
        print(result.line, flush=True)

    with tempfile.TemporaryDirectory() as directory:
        checks = one_gpu_checks(ctx, directory) + [("nccl2", lambda: check_multi_gpu(ctx, gpus))]
        if args.scale:
            checks.append(("scale", lambda: check_scale(ctx, args.nodes)))
        stopped = run_checks(checks, report)
    if stopped is not None:
        print(f"no CUDA device: stopping before {stopped}. Run this on a machine with a GPU.")
        return 0
    failed = [r.name for r in results if r.status == "FAIL"]
    print(f"{len(results) - len(failed)} of {len(results)} checks passed or skipped, {len(failed)} failed "
          f"({', '.join(failed) or 'none'}); {time.perf_counter() - start:.0f} s")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(device=torch.cuda.get_device_name(0), gpus=gpus, torch=torch.__version__,
                                              results=[r.__dict__ for r in results]), indent=2, default=str) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
