"""Peak memory of a measured process: a sampling thread inside it, and the kernel's high-water mark.

:class:`MemorySampler` runs inside every measured process (the worker that launches a run and every rank it spawns).
A daemon thread keeps the peaks of USS (pages only this process maps), PSS (private pages plus each shared page divided
by the number of processes mapping it; the PSS of all processes adds up to their footprint) and RSS (every resident
page, shared ones counted in full) from ``psutil.Process().memory_full_info()``. That call walks the process's page
tables (about 25 ms of a core for 3 GiB), so reading it every ``interval`` seconds in every rank would take a share
of the cores that grows with the number of processes: the thread reads the kernel's counters (``/proc/self/status``,
constant time) every ``interval`` seconds and the full figures only when the private anonymous memory (``RssAnon``)
reaches a new high, where USS peaks, and at least every ``full_every`` seconds.
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


def gib(b: Optional[float]) -> str:
    """Bytes as GiB with two decimals for a table cell (``"–"`` where not measured)."""
    return "–" if b is None else f"{b / GIB:.2f}"


def _status_bytes(field: str) -> Optional[int]:
    """A ``kB`` field of ``/proc/self/status`` in bytes, or ``None`` off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def vm_hwm_bytes() -> Optional[int]:
    """Kernel high-water mark of this process's RSS (``VmHWM``, bytes), or ``None`` off Linux."""
    return _status_bytes("VmHWM")


def rss_anon_bytes() -> Optional[int]:
    """Resident private anonymous memory of this process (``RssAnon``, bytes), or ``None`` off Linux."""
    return _status_bytes("RssAnon")


class MemorySampler:
    """Peak USS / PSS / RSS of this process, sampled by a background thread.

    Args:
        path: JSON file the peaks are written to (bytes), every ``flush_s`` seconds and at :meth:`stop`.
        interval: Seconds between reads of the kernel's counters.
        flush_s: Seconds between writes of ``path``.
        full_every: Most seconds between two full samples.
        slack: Bytes ``RssAnon`` must grow past its high at the last full sample to trigger one (the interpreter
            grows by pages all the time; a peak is then read at most ``slack`` low until the next periodic sample).
    """

    def __init__(self, path: Path, interval: float = 0.2, flush_s: float = 1.0, full_every: float = 2.0,
                 slack: int = 4 * 2**20) -> None:
        self.path, self.interval, self.flush_s, self.full_every = Path(path), interval, flush_s, full_every
        self.slack = slack
        self._anon_high, self._last_full = -1, 0.0
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

    def _due(self) -> bool:
        """Whether a full sample is due: ``RssAnon`` more than ``slack`` above every earlier full sample's, or
        ``full_every`` passed."""
        anon = rss_anon_bytes()
        grew = anon is None or anon > self._anon_high + self.slack
        if grew or time.monotonic() - self._last_full >= self.full_every:
            self._anon_high, self._last_full = max(self._anon_high, anon or 0), time.monotonic()
            return True
        return False

    def _loop(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.interval):
            try:
                if self._due():
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


