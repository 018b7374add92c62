"""Run a function on every rank of a fresh gloo world of forked processes.

The processes are started the way torchrun starts them (``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT`` in the environment), so a ``Trainer(devices=S,
strategy=GNNPipeStrategy())`` created inside ``fn`` uses the no-op launcher and each rank runs
its own ``fit``. Forking skips the 10-20 s of imports a spawned worker pays on a loaded
2-core machine, and nothing stands between the ranks: if one rank dies, the others must end by
themselves (process-group timeout or connection error), which is what the failure tests check.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import socket
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RankResult:
    """What one rank left behind: its exit code, its return value or its formatted error."""

    rank: int
    exitcode: Optional[int]
    value: Any = None
    error: Optional[str] = None
    seconds: float = 0.0


def rank_env(rank: int, nprocs: int, port: int, nodes: int = 1) -> Dict[str, str]:
    """The environment of global rank ``rank`` of ``nprocs`` processes on ``nodes`` nodes (node-major).

    One node: ``LOCAL_RANK = RANK``, ``NODE_RANK=0`` (Lightning's ``LightningEnvironment``). Several nodes: what
    ``torchrun --nnodes=N --nproc-per-node=P --node-rank=n`` gives each of its workers (``GROUP_RANK``,
    ``LOCAL_WORLD_SIZE``, ``TORCHELASTIC_RUN_ID``, so Lightning picks its ``TorchElasticEnvironment``), plus
    ``NODE_RANK``; all "nodes" are this machine.
    """
    per_node = nprocs // nodes
    env = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(nprocs), RANK=str(rank),
               LOCAL_RANK=str(rank % per_node), NODE_RANK=str(rank // per_node), OMP_NUM_THREADS="1")
    if nodes > 1:
        env.update(GROUP_RANK=str(rank // per_node), LOCAL_WORLD_SIZE=str(per_node),
                   TORCHELASTIC_RUN_ID=f"world{port}")
    return env


def _worker(rank: int, nprocs: int, port: int, out: str, fn: Callable, args: tuple, kwargs: dict,
            nodes: int = 1, payload: Optional[bytes] = None) -> None:
    os.environ.update(rank_env(rank, nprocs, port, nodes))
    import torch

    if payload is not None:  # spawn: the call, pickled with plain pickle (copies, no shared tensor memory)
        fn, args, kwargs = pickle.loads(payload)

    # One thread, and OMP_NUM_THREADS so that Lightning keeps it: an OpenMP parallel region in a
    # child forked after the parent used OpenMP can deadlock (GNU libgomp), seen with 1 rank.
    torch.set_num_threads(1)
    path = Path(out) / f"rank{rank}.pkl"
    try:
        value = fn(*args, **kwargs)
        path.write_bytes(pickle.dumps(("ok", value)))
        code = 0
    except BaseException:  # noqa: BLE001 - report everything to the parent
        path.write_bytes(pickle.dumps(("error", traceback.format_exc())))
        code = 1
    os._exit(code)  # skip the parent's (pytest's) atexit handlers


def run_world(nprocs: int, fn: Callable, *args: Any, timeout: float = 120.0, linger: Optional[float] = None,
              nodes: int = 1, start_method: str = "fork", **kwargs: Any) -> List[RankResult]:
    """Fork ``nprocs`` ranks that each call ``fn(*args, **kwargs)``; wait at most ``timeout`` seconds.

    With ``linger``, once some rank has exited, the others get at most ``linger`` more seconds.
    With ``nodes > 1`` the ranks get the environment of ``nprocs / nodes`` processes per node, as torchrun
    starts them on each node (:func:`rank_env`). ``start_method="spawn"`` starts fresh interpreters instead (``fn``
    and the arguments are pickled): needed for ranks that use CUDA once the parent process has.

    Returns every rank's :class:`RankResult` (``exitcode`` ``None`` for a rank that was still
    running at the deadline; it is then killed). No process outlives this call.
    """
    if nodes < 1 or nprocs % nodes:
        raise ValueError(f"run_world: `nodes` must divide the number of processes {nprocs} (got {nodes})")
    ctx = mp.get_context(start_method)
    port = free_port()
    # multiprocessing's spawn pickler would hand every rank the parent's CPU tensors in shared memory (torch's
    # reductions), so that the ranks' optimizers would all update one copy of the weights: pickle plainly instead.
    payload = pickle.dumps((fn, args, kwargs)) if start_method == "spawn" else None
    call = (None, (), {}) if payload is not None else (fn, args, kwargs)
    with tempfile.TemporaryDirectory() as out:
        start = time.monotonic()
        procs = [ctx.Process(target=_worker, args=(r, nprocs, port, out, *call, nodes, payload), daemon=True)
                 for r in range(nprocs)]
        for p in procs:
            p.start()
        ended: List[Optional[float]] = [None] * nprocs
        deadline = start + timeout
        while time.monotonic() < deadline and any(p.is_alive() for p in procs):
            for r, p in enumerate(procs):
                if ended[r] is None and not p.is_alive():
                    ended[r] = time.monotonic() - start
                    if linger is not None:
                        deadline = min(deadline, time.monotonic() + linger)
            time.sleep(0.05)
        results = []
        for r, p in enumerate(procs):
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join()
                results.append(RankResult(r, None, seconds=time.monotonic() - start))
                continue
            p.join()
            res = RankResult(r, p.exitcode, seconds=ended[r] if ended[r] is not None else time.monotonic() - start)
            f = Path(out) / f"rank{r}.pkl"
            if f.exists():
                kind, payload = pickle.loads(f.read_bytes())
                if kind == "ok":
                    res.value = payload
                else:
                    res.error = payload
            results.append(res)
        return results


def values(results: List[RankResult]) -> List[Any]:
    """Return every rank's value, or raise with the errors of the ranks that failed."""
    bad = [r for r in results if r.exitcode != 0]
    if bad:
        lines = [f"rank {r.rank}: exit {r.exitcode}\n{r.error or '(no error recorded: killed or timed out)'}"
                 for r in bad]
        raise AssertionError("world failed:\n" + "\n".join(lines))
    return [r.value for r in results]
