"""Cached run records and the facts every record carries: the machine, the package versions, the commit.

A benchmark appends one JSON line per measured run to its own ``runs.jsonl`` (beside its code) and builds its page
from those lines alone, so a page can be rewritten without measuring and a rerun measures only what is missing.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import List

import psutil

ROOT = Path(__file__).resolve().parents[2]


def cache_key(cfg: dict) -> str:
    """The JSON of a run's parameters (sorted keys): its identity in the cache."""
    return json.dumps(cfg, sort_keys=True)


def load_cache(path: Path) -> List[dict]:
    """Every record of the cache, oldest first (a later line for the same key wins where callers index by key)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_cache(path: Path, rec: dict) -> None:
    """Append one record (a JSON line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def host_info() -> dict:
    """Hostname, CPU model, cores, total memory (bytes) and the 1-minute load average now."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"hostname": socket.gethostname(), "cpu": cpu, "cores": os.cpu_count(),
            "memory": psutil.virtual_memory().total, "load_before": os.getloadavg()[0]}


def git_info() -> dict:
    """Commit of the checkout and whether tracked files differ from it (read-only: no index refresh)."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                env=env, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, env=env).stdout.strip()
        return {"commit": commit, "dirty": bool(dirty)}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "dirty": None}


def package_versions() -> dict:
    """Installed versions, read without importing torch."""
    out = {}
    for name in ("torch", "torch_geometric", "lightning"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    out["python"] = platform.python_version()
    return out
