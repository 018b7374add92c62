"""Run the 2- and 4-process training tests many times; count passes, failures and hangs.

Each run trains ``ChunkLossGCN`` (4 layers, 4 chunks, 3 epochs) on a 300-node SBM graph under
``GNNPipeStrategy`` with 2 and with 4 stages, each with GPipe and 1F1B, and checks every rank's
losses against the single-process reference of the same algorithm (``tests/reference.py``,
atol 1e-6), as ``tests/test_exactness.py`` does. A run that does not finish within
``--timeout`` seconds counts as timed out (a hang) and its processes are killed.

Modes:

* default: every scenario is a fresh world of forked gloo ranks (``tests/world.py``, the
  torchrun way of launching: no launcher between the ranks), about 1-2 s per scenario;
* ``--pytest``: runs the tests of ``tests/test_exactness.py`` that use the strategy's real
  spawn launcher (a fresh interpreter per rank; ``-k "one_chunk_two_stages or every_stage_trains"``)
  once per run, which is slower.

Usage (from the repository root)::

    python -m checks.stress                # 50 runs
    python -m checks.stress --runs 10 --pytest
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCENARIOS: List[Tuple[int, str]] = [(2, "gpipe"), (2, "1f1b"), (4, "gpipe"), (4, "1f1b")]


def run_world_scenario(stages: int, schedule: str, dm, ref: List[float], timeout: float) -> str:
    """Return ``"passed"``, ``"failed"`` or ``"timed out"`` for one training world."""
    from tests.helpers import ChunkLossGCN
    from tests.scenarios import losses_job
    from tests.world import run_world

    results = run_world(stages, losses_job, ChunkLossGCN(16, 32, 4, 4), dm, stages, len(ref),
                        strategy_kwargs={"schedule": schedule}, timeout=timeout)
    if any(r.exitcode is None for r in results):
        return "timed out"
    if any(r.exitcode != 0 for r in results):
        return "failed"
    ok = all(len(r.value) == len(ref) and max(abs(a - b) for a, b in zip(r.value, ref)) <= 1e-6 for r in results)
    return "passed" if ok else "failed"


SPAWN_TESTS = "one_chunk_two_stages or every_stage_trains"  # the exactness tests that spawn their ranks


def run_pytest(timeout: float) -> str:
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:warnings", "tests/test_exactness.py", "-k",
           SPAWN_TESTS]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timed out"  # subprocess.run kills the child; pytest's spawned ranks die with their parent
    return "passed" if done.returncode == 0 else "failed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="repetitions (default 50)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before a run counts as a hang")
    parser.add_argument("--pytest", action="store_true", help="run the pytest tests (spawn launcher) instead")
    args = parser.parse_args()

    counts: Counter = Counter()
    start = time.monotonic()
    if args.pytest:
        for i in range(args.runs):
            outcome = run_pytest(args.timeout * len(SCENARIOS))
            counts[(f"pytest tests/test_exactness.py -k '{SPAWN_TESTS}'", outcome)] += 1
            print(f"run {i + 1}/{args.runs}: {outcome}", flush=True)
    else:
        from lightning_gnnpipe import GraphChunkDataModule
        from tests.helpers import ChunkLossGCN, sbm_graph
        from tests.reference import chunked_reference

        graph = sbm_graph(num_nodes=300)
        dm = GraphChunkDataModule(graph, num_chunks=4)
        ref = chunked_reference(ChunkLossGCN(16, 32, 4, 4), graph, dm.plan, 3)
        for i in range(args.runs):
            outcomes = []
            for stages, schedule in SCENARIOS:
                outcome = run_world_scenario(stages, schedule, dm, ref, args.timeout)
                counts[(f"{stages} processes, {schedule}", outcome)] += 1
                outcomes.append(outcome)
            print(f"run {i + 1}/{args.runs}: {outcomes}", flush=True)

    names = sorted({name for name, _ in counts})
    print(f"\n{args.runs} runs in {time.monotonic() - start:.0f} s (timeout {args.timeout:.0f} s per scenario)")
    width = max([46] + [len(name) for name in names])
    print(f"| {'scenario':<{width}} | passed | failed | timed out |")
    print(f"|{'-' * (width + 2)}|--------|--------|-----------|")
    for name in names:
        print(f"| {name:<{width}} | {counts[(name, 'passed')]:>6} | {counts[(name, 'failed')]:>6} | "
              f"{counts[(name, 'timed out')]:>9} |")
    bad = sum(v for (_, outcome), v in counts.items() if outcome != "passed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
