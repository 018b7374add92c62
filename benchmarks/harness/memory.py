"""Peak memory of a measured process: a sampling thread inside it, and the kernel's high-water mark.

:class:`MemorySampler` runs inside every measured process (the worker that launches a run and every rank it spawns).
A daemon thread reads ``psutil.Process().memory_full_info()`` every ``interval`` seconds and keeps the peaks of USS
(pages only this process maps), PSS (private pages plus each shared page divided by the number of processes mapping
it; the PSS of all processes adds up to their footprint) and RSS (every resident page, shared ones counted in full).
Peaks are flushed to a JSON file every second, so a run killed for memory still leaves its peaks so far.
:func:`read_process_peaks` collects them by role for the orchestrator.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Dict, Optional

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


