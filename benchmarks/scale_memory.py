"""Memory sampling and guarded subprocess runs for ``benchmarks/scale.py``.

Two halves:

* :class:`MemorySampler` runs inside every measured process (the worker that launches a run and
  every rank it spawns). A daemon thread reads ``psutil.Process().memory_full_info()`` every
  ``interval`` seconds and keeps the peaks of USS (pages only this process maps), PSS (private
  pages plus each shared page divided by the number of processes mapping it; the PSS of all
  processes adds up to their footprint) and RSS (every resident page, shared ones counted in full).
  Peaks are flushed to a JSON file every second, so a run killed for memory still leaves its
  peaks so far.
* :func:`run_watched` runs one worker command in its own process group from the orchestrator,
  samples the machine's ``psutil.virtual_memory()`` every ``interval`` seconds, and kills the
  whole group when available memory drops under the guard or the timeout passes.

Only the standard library and psutil are imported, so the orchestrator stays small.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

import psutil

GIB = 2**30


def vm_hwm_bytes() -> Optional[int]:
    """Kernel high-water mark of this process's RSS (``VmHWM``, bytes), or ``None`` off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class MemorySampler:
    """Peak USS / PSS / RSS of this process, sampled by a background thread.

    Args:
        path: JSON file the peaks are written to (bytes), every ``flush_s`` seconds and at :meth:`stop`.
        interval: Seconds between samples.
        flush_s: Seconds between writes of ``path``.
    """

    def __init__(self, path: Path, interval: float = 0.2, flush_s: float = 1.0) -> None:
        self.path, self.interval, self.flush_s = Path(path), interval, flush_s
        self.peak: Dict[str, int] = {"uss": 0, "pss": 0, "rss": 0}
        self.samples = 0
        self._proc = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="memory-sampler", daemon=True)

    def start(self) -> "MemorySampler":
        """Take a first sample and start the thread; returns ``self``."""
        self.sample()
        self._thread.start()
        return self

    def sample(self) -> None:
        """Read the memory of this process once and update the peaks."""
        info = self._proc.memory_full_info()
        for key in self.peak:
            self.peak[key] = max(self.peak[key], int(getattr(info, key)))
        self.samples += 1

    def flush(self) -> None:
        """Write the peaks (bytes), the kernel's ``VmHWM`` and the sample count to ``path`` atomically."""
        row = {**self.peak, "vm_hwm": vm_hwm_bytes(), "samples": self.samples, "pid": os.getpid()}
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(row))
        os.replace(tmp, self.path)

    def _loop(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.interval):
            try:
                self.sample()
                if time.monotonic() - last >= self.flush_s:
                    self.flush()
                    last = time.monotonic()
            except (OSError, psutil.Error):  # the interpreter is shutting down
                return

    def stop(self) -> Dict[str, int]:
        """Stop the thread, take a last sample, write ``path``; returns the peaks (bytes)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.sample()
        self.flush()
        return dict(self.peak)


def read_process_peaks(run_dir: Path) -> Dict[str, dict]:
    """Peaks written by the samplers of one run, by role (``main``, ``rank0``, ...), from ``mem_<role>.json``."""
    out = {}
    for path in sorted(Path(run_dir).glob("mem_*.json")):
        try:
            out[path.stem[len("mem_"):]] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return out


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
