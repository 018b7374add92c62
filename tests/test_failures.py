"""A failing rank ends every rank, promptly, with the original error, and leaves no process.

Two launches:

* the user's way (``python script.py``), where the strategy's launcher stops the other ranks
  once one fails: ``tests/failing_fit.py`` in a subprocess, both failure modes at once to share
  the start-up time, with the launcher in fork mode (the spawn launcher's class and code path
  without re-importing torch in each rank; ``python -m tests.failing_fit raise 10`` runs it with
  spawn, see docs/reliability.md);
* a world without a launcher (:func:`tests.world.run_world`, as under torchrun or across
  nodes), where the surviving ranks must end by themselves: on a connection error at once,
  or after the process-group timeout if the failed rank hangs with its connections open.
"""

import os
import re
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from lightning.pytorch import Trainer

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, GraphParallelStrategy
from lightning_gnnpipe.strategy.failures import PEER_FAILURE_GRACE_S
from tests.helpers import sbm_graph
from tests.scenarios import failing_job
from tests.world import free_port, run_world

ROOT = Path(__file__).resolve().parents[1]
PG_TIMEOUT_S = 10.0  # the short process-group timeout of these tests (the default is 600 s)
LIMIT_S = 60.0  # every rank must be gone this long after a failure


class _Launch:
    """``python -m tests.failing_fit MODE`` with its output in files and its descendants tracked."""

    def __init__(self, mode: str, directory: Path) -> None:
        self.stderr_path = directory / f"{mode}.err"
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.failing_fit", mode, str(PG_TIMEOUT_S), "fork"], cwd=ROOT,
                stdout=subprocess.DEVNULL, stderr=err,
                # Distinct ports: two launches picking theirs at the same moment can collide.
                env={**os.environ, "PYTHONPATH": str(ROOT), "MASTER_PORT": str(free_port())})
        self.start = time.monotonic()
        self.seconds = None
        self.descendants = {}

    def poll(self) -> bool:
        """Record new descendants; return whether the main process has ended."""
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                self.descendants.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass
        if self.seconds is None and self.proc.poll() is not None:
            self.seconds = time.monotonic() - self.start
            self.end_time = time.time()
        return self.seconds is not None

    def seconds_after_failure(self) -> float:
        """Seconds from the injected failure (stamped in stderr) to the end of the job."""
        match = re.search(r"FailingGCN: failing \(\w+\) at ([0-9.]+)", self.stderr)
        assert match, "the failure was never injected"
        return self.end_time - float(match.group(1))

    def survivors(self):
        gone, alive = psutil.wait_procs(list(self.descendants.values()), timeout=5)
        return [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    directory = tmp_path_factory.mktemp("failing_fit")
    runs = {mode: _Launch(mode, directory) for mode in ("raise", "kill")}
    deadline = time.monotonic() + 240  # start-up (imports) included
    while not all([run.poll() for run in runs.values()]) and time.monotonic() < deadline:  # poll every run
        time.sleep(0.1)
    yield runs
    for run in runs.values():  # never leave anything behind, even if a test failed
        for p in [run.proc] + list(run.descendants.values()):
            try:
                psutil.Process(p.pid).kill()
            except psutil.NoSuchProcess:
                pass


def test_exception_on_one_rank_ends_every_rank(launches):
    run = launches["raise"]
    assert run.seconds is not None, "the job did not end"
    assert run.proc.returncode != 0
    assert "RuntimeError: injected failure in training_step" in run.stderr
    assert "this error was raised on rank 1 (stage 1 of 2, layers [1])" in run.stderr
    print(f"{run.proc.args[3]}: job ended {run.seconds_after_failure():.2f} s after the failure")
    assert run.seconds_after_failure() < LIMIT_S
    assert len(run.descendants) >= 2  # both spawned ranks were seen ...
    assert run.survivors() == []  # ... and none outlives the job


def test_sigkilled_rank_ends_every_rank(launches):
    run = launches["kill"]
    assert run.seconds is not None, "the job did not end"
    assert run.proc.returncode != 0
    assert "process 1 terminated with signal SIGKILL" in run.stderr
    assert len(run.descendants) >= 2 and run.survivors() == []
    print(f"{run.proc.args[3]}: job ended {run.seconds_after_failure():.2f} s after the failure")
    assert run.seconds_after_failure() < LIMIT_S


@pytest.fixture(scope="module")
def small_dm():
    return GraphChunkDataModule(sbm_graph(num_nodes=100), num_chunks=2)


def test_exception_without_launcher(small_dm):
    rank0, rank1 = run_world(2, failing_job, small_dm, "raise", PG_TIMEOUT_S, timeout=LIMIT_S)
    assert rank1.exitcode == 1 and "this error was raised on rank 1 (stage 1 of 2" in rank1.error
    assert rank0.exitcode == 1 and "stopped because another rank stopped answering" in rank0.error
    assert rank0.seconds < LIMIT_S


@pytest.mark.parametrize("mode,fail_rank", [("raise", 0), ("validation", 0), ("validation", 1)])
def test_exception_on_rank_0_or_in_validation_without_launcher(small_dm, mode, fail_rank):
    """Rank 0 (it also serves the rendezvous store) failing in ``training_step``, or either rank in
    ``validation_step`` (after the exact forward; its peer learns of it in the next collective)."""
    results = run_world(2, failing_job, small_dm, mode, PG_TIMEOUT_S, fail_rank=fail_rank, timeout=LIMIT_S)
    failed, peer = results[fail_rank], results[1 - fail_rank]
    step = "validation_step" if mode == "validation" else "training_step"
    assert failed.exitcode == 1 and f"RuntimeError: injected failure in {step}" in failed.error
    assert f"this error was raised on rank {fail_rank} (stage {fail_rank} of 2, layers [{fail_rank}])" in failed.error
    assert peer.exitcode == 1 and "stopped because another rank stopped answering" in peer.error
    print(f"{mode} on rank {fail_rank}: ranks ended after {[round(r.seconds, 2) for r in results]} s")
    assert max(r.seconds for r in results) < LIMIT_S


def test_layer_error_reaches_the_user_unwrapped(small_dm):
    """A block's own exception, not torch's ``RuntimeError("[Stage 0] failed to run forward")`` around it."""
    rank0, rank1 = run_world(2, failing_job, small_dm, "layer", PG_TIMEOUT_S, timeout=LIMIT_S)
    assert rank0.exitcode == 1
    lines = rank0.error.strip().splitlines()
    assert "ValueError: injected failure in a layer's forward" in lines  # a whole line: the error itself
    assert "failed to run forward" not in rank0.error
    assert "raised in the forward pass of pipeline stage 0" in rank0.error
    assert "this error was raised on rank 0 (stage 0 of 2, layers [0])" in rank0.error
    assert rank1.exitcode == 1 and "stopped because another rank stopped answering" in rank1.error


@pytest.mark.parametrize("signal_name,option", [("kill", "timeout"), ("stop", "timeout"), ("stop", "exchange_timeout")])
def test_lost_rank_without_launcher(small_dm, signal_name, option):
    """SIGKILL closes the rank's connections (peers fail at once); SIGSTOP leaves them open (timeout). With only
    ``exchange_timeout`` short (``timeout`` at its 600 s default) the pipeline's own transfers end the wait."""
    # After the first rank ends, the other gets `linger` seconds: rank 0 needs its grace period
    # after rank 1 was killed; a stopped rank 1 never ends by itself.
    linger = PEER_FAILURE_GRACE_S + 5 if signal_name == "kill" else 0.5
    rank0, rank1 = run_world(2, failing_job, small_dm, signal_name, PG_TIMEOUT_S, option=option, timeout=LIMIT_S,
                             linger=linger)
    assert rank1.exitcode in ((-9,) if signal_name == "kill" else (None,))  # killed / still hanging
    assert rank0.exitcode == 1 and "stopped because another rank stopped answering" in rank0.error
    if signal_name == "stop":
        assert "Timed out" in rank0.error
        assert rank0.seconds > PG_TIMEOUT_S
    assert rank0.seconds < PG_TIMEOUT_S + PEER_FAILURE_GRACE_S + 20  # start-up and one epoch included


def test_exchange_timeout_must_be_a_positive_timedelta():
    with pytest.raises(ValueError, match=r"`exchange_timeout` must be a positive timedelta \(got 30\)"):
        GNNPipeStrategy(exchange_timeout=30)
    with pytest.raises(ValueError, match=r"GraphParallelStrategy: `exchange_timeout` must be a positive timedelta"):
        GraphParallelStrategy(exchange_timeout=timedelta(0))
    assert GNNPipeStrategy(timeout=timedelta(seconds=10))._exchange_timeout == timedelta(seconds=10)  # at most


def test_nccl_error_handling_is_switched_on_unless_set():
    """NCCL's watchdog must abort the communicators and end the process on a timeout (``1``, torchrun's default);
    a user's own value stays, and nothing is set for gloo."""
    from lightning_gnnpipe.strategy.failures import NCCL_ERROR_HANDLING, enable_nccl_error_handling

    env = {}
    assert enable_nccl_error_handling("nccl", env) and env == {NCCL_ERROR_HANDLING: "1"}
    env = {NCCL_ERROR_HANDLING: "3"}
    assert not enable_nccl_error_handling("cpu:gloo,cuda:nccl", env) and env == {NCCL_ERROR_HANDLING: "3"}
    env = {}
    assert not enable_nccl_error_handling("gloo", env) and not enable_nccl_error_handling(None, env) and env == {}


def test_rank_location_names_stage_and_partition(monkeypatch):
    # The note names the rank's stage in its pipeline, not its global rank: under hybrid parallelism (G = 2
    # pipelines of S = 2 stages) global rank 3 is stage 1 of partition 1. Graph parallelism names the partition.
    trainer = Trainer(accelerator="cpu", devices=4, strategy=GNNPipeStrategy(graph_parallel_size=2), logger=False)
    monkeypatch.setattr(GNNPipeStrategy, "global_rank", property(lambda self: 3))
    assert trainer.strategy.rank_location() == "rank 3 (stage 1 of 2, partition 1 of 2)"
    trainer.strategy._layers = [[0, 1], [2, 3]]
    assert trainer.strategy.rank_location() == "rank 3 (stage 1 of 2, partition 1 of 2, layers [2, 3])"
    trainer = Trainer(accelerator="cpu", devices=3, strategy=GraphParallelStrategy(), logger=False)
    monkeypatch.setattr(GraphParallelStrategy, "global_rank", property(lambda self: 2))
    assert trainer.strategy.rank_location() == "rank 2 (partition 2 of 3)"


def test_a_rank_of_ours_destroys_its_process_group_at_exit():
    """The exit hook runs while the interpreter is whole (atexit runs hooks last-in first-out: a hook registered
    before it sees the group gone), and registers once however often it is asked."""
    code = f"""
import atexit, os
import torch.distributed as dist
from lightning_gnnpipe.strategy import launcher
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{free_port()}")
dist.init_process_group("gloo", rank=0, world_size=1)
atexit.register(lambda: print("initialized at exit:", dist.is_initialized(), flush=True))
launcher.destroy_groups_at_exit()
launcher.destroy_groups_at_exit()
print("before exit:", dist.is_initialized(), flush=True)
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines() == ["before exit: True", "initialized at exit: False"]
