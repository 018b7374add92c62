"""Run one measured worker in its own process group, watching the machine's memory (the orchestrators' half).

:func:`run_watched` samples ``psutil.virtual_memory()`` every ``interval`` seconds while the worker runs and kills its
whole group when available memory drops under a guard or a timeout passes; :func:`classify` names the outcome and
:func:`log_tail` keeps the end of its log. Only the standard library and psutil are imported.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

import psutil


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the rendezvous of a benchmark's own process group)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group that ``proc`` leads (it was started with ``start_new_session``)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_watched(cmd: List[str], log_path: Path, timeout_s: float, guard_bytes: int, cwd: Path,
                interval: float = 0.2, env: Optional[Dict[str, str]] = None) -> dict:
    """Run ``cmd`` in a new process group, watching the machine's memory.

    Args:
        cmd: Command line of the worker.
        log_path: File receiving its stdout and stderr.
        timeout_s: Wall-clock limit (seconds); past it the group is killed.
        guard_bytes: Kill the group when ``psutil.virtual_memory().available`` drops below this (bytes).
        cwd: Working directory.
        interval: Seconds between samples of the machine's memory.
        env: The worker's environment (default: this process's).

    Returns:
        ``returncode``, ``killed_by`` (``None``, ``"guard"`` or ``"timeout"``), ``wall_s`` (seconds) and the machine's
        memory in bytes: ``used_before``, ``used_peak``, ``used_delta`` (peak minus before), ``available_min``,
        ``total``.
    """
    vm = psutil.virtual_memory()
    before, peak, avail_min = vm.used, vm.used, vm.available
    killed_by = None
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True, env=env)
        try:
            while proc.poll() is None:
                vm = psutil.virtual_memory()
                peak, avail_min = max(peak, vm.used), min(avail_min, vm.available)
                if vm.available < guard_bytes:
                    killed_by = "guard"
                elif time.monotonic() - start > timeout_s:
                    killed_by = "timeout"
                if killed_by:
                    kill_group(proc)
                    break
                time.sleep(interval)
        except BaseException:  # Ctrl-C: leave no orphaned ranks behind
            kill_group(proc)
            raise
    return {"returncode": proc.returncode, "killed_by": killed_by, "wall_s": time.monotonic() - start,
            "used_before": before, "used_peak": peak, "used_delta": peak - before, "available_min": avail_min,
            "total": vm.total}


def classify(watch: dict, has_result: bool, log_tail: str) -> str:
    """Name the outcome of a watched run: ``ok``, or why it failed."""
    if watch["killed_by"] == "guard":
        return "out of memory (guard)"
    if watch["killed_by"] == "timeout":
        return "timeout"
    oom_words = ("can't allocate memory", "not enough memory", "MemoryError", "std::bad_alloc")
    if any(w in log_tail for w in oom_words):
        return "out of memory (allocation failed)"
    if watch["returncode"] in (-9, 137) or "signal SIGKILL" in log_tail:
        return "killed (SIGKILL; likely the kernel OOM killer)"
    if watch["returncode"] != 0:
        return f"error (exit {watch['returncode']})"
    return "ok" if has_result else "error (no result file)"


def log_tail(log_path: Path, lines: int = 20, chars: int = 2000) -> str:
    """The last ``lines`` lines of a log that are not warnings (at most ``chars`` characters)."""
    try:
        text = Path(log_path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    kept = [t for t in text if t.strip() and "Warning" not in t and "warnings.warn" not in t]
    return "\n".join(kept[-lines:])[-chars:]
