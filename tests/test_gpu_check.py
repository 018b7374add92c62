"""``checks/gpu_check.py`` on the CPU: it stops cleanly before its first CUDA step, and its checks (run here on
the CPU with gloo in place of CUDA with NCCL) pass on correct fits and fail on wrong ones."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from checks import gpu_check
from lightning_gnnpipe.pipeline.schedule import unavailable
from tests.helpers import sbm_graph  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
from tests.world import run_world, values  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the check runs for real")
def test_without_cuda_it_runs_to_the_first_cuda_step_and_exits_0():
    proc = subprocess.run([sys.executable, "-m", "checks.gpu_check"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("no CUDA device: stopping before fit_gnnpipe_gpipe on CUDA with NCCL (its CPU/gloo "
                                "reference ran: losses [")
    assert lines[-1].endswith("Run this on a machine with a GPU.")


def _checks_on_cpu(names):
    ctx = gpu_check.Context(torch.device("cpu"), "gloo", require_cuda=False, graph=sbm_graph(300))
    import tempfile

    lines = []
    with tempfile.TemporaryDirectory() as directory:
        checks = [c for c in gpu_check.one_gpu_checks(ctx, directory) if c[0] in names]
        checks.append(("nccl2", lambda: gpu_check.check_multi_gpu(ctx, gpus=1)))
        assert gpu_check.run_checks(checks, lambda r: lines.append(r.line)) is None
    return lines


def test_checks_pass_on_the_cpu_with_gloo_in_place_of_nccl():
    """The one-GPU checks, run on the CPU in a fresh forked process: a fit against itself (GPipe with NodeDropout
    and clipping, ZB-V with two local stages), the resume, the boundary tensors of a 2-stage split and determinism
    pass; the CUDA-only sync check and the multi-GPU fits are skipped with their reason."""
    names = ["fit_gnnpipe_gpipe", "fit_zbv", "resume", "boundary_tensors", "host_syncs", "deterministic"]
    lines = values(run_world(1, _checks_on_cpu, names, timeout=240))[0]
    print("\n".join(lines))
    zbv = "SKIP fit_zbv" if unavailable("zbv") else "PASS fit_zbv"  # torch 2.11, 2.12: refused with its reason
    assert [line.split(":")[0] for line in lines] == [
        "PASS fit_gnnpipe_gpipe", zbv, "PASS resume", "PASS boundary_tensors", "SKIP host_syncs",
        "PASS deterministic", "SKIP nccl2_gnnpipe", "SKIP nccl2_graph_parallel", "SKIP nccl2_hybrid"]
    assert "max |loss diff| 0.0e+00" in lines[0] and "bit for bit" in lines[2]
    assert "activation (76, 32) bfloat16; gradient (76, 32) bfloat16" in lines[3]
    assert "two NCCL ranks cannot share one GPU (NCCL stops with 'Duplicate GPU detected')" in lines[-1]


def test_compare_fails_on_a_difference_a_nan_or_a_missing_epoch():
    ok = gpu_check.compare("fit", [1.0, 0.5], [1.0, 0.50005], 1e-4, "x")
    assert ok.status == "PASS" and "max |loss diff| 5.0e-05 (tol 1e-04)" in ok.line
    assert gpu_check.compare("fit", [1.0, 0.5], [1.0, 0.5002], 1e-4, "x").status == "FAIL"
    assert gpu_check.compare("fit", [1.0, float("nan")], [1.0, 0.5], 1e-4, "x").status == "FAIL"
    assert gpu_check.compare("fit", [1.0], [1.0, 0.5], 1e-4, "x").status == "FAIL"


def test_multi_process_check_on_spawned_ranks():
    """The multi-GPU check's machinery (spawned ranks, plain-pickled arguments, the wire check on every rank), with
    gloo on both sides: graph parallelism on 2 processes equals itself."""
    ctx = gpu_check.Context(torch.device("cpu"), "gloo", require_cuda=False, graph=sbm_graph(300))
    (result,) = gpu_check.check_multi_gpu(ctx, gpus=2, side=("cpu", "gloo"), names=["nccl2_graph_parallel"])
    assert result.status == "PASS" and "max |loss diff| 0.0e+00" in result.line, result.line
