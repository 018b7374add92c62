"""Machines emulated on one host: one memory cgroup (v1) per machine, each with its own cap, one process tree in each.

``Machine(name, cap_bytes)`` makes ``/sys/fs/cgroup/memory/<name>`` with ``memory.limit_in_bytes`` (and the same
``memory.memsw.limit_in_bytes``: no swap), :meth:`Machine.start` runs a command inside it (the shell puts itself in
the cgroup, then ``exec``s the command, so every child is charged there too), :meth:`Machine.peak_bytes` reads the
kernel's ``memory.max_usage_in_bytes`` (anonymous memory and the page cache the machine's processes filled) and
:meth:`Machine.oom_kills` the kernel's OOM kills inside it. Needs root; the cgroup goes at :meth:`Machine.remove`.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path("/sys/fs/cgroup/memory")


class Machine:
    def __init__(self, name: str, cap_bytes: Optional[int]) -> None:
        self.name, self.path = name, ROOT / name
        if self.path.exists():
            self.remove()
        self.path.mkdir()
        if cap_bytes is not None:
            (self.path / "memory.limit_in_bytes").write_text(str(cap_bytes))
            memsw = self.path / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                memsw.write_text(str(cap_bytes))
        (self.path / "memory.max_usage_in_bytes").write_text("0")

    def start(self, cmd: List[str], log: Path, env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
        """Run ``cmd`` inside this machine, its output to ``log``."""
        shell = f'echo $$ > {self.path}/cgroup.procs && exec "$@"'
        return subprocess.Popen(["sh", "-c", shell, "sh", *cmd], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)

    def peak_bytes(self) -> int:
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def oom_kills(self) -> int:
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return int((self.path / "memory.failcnt").read_text() != "0")

    def remove(self) -> None:
        for _ in range(50):
            procs = (self.path / "cgroup.procs").read_text().split()
            if not procs:
                break
            for pid in procs:
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        self.path.rmdir()
