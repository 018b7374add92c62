"""An emulated cluster link: a network namespace whose loopback carries at most ``R`` bits per second.

The ranks of a run started inside it (``ip netns exec NAME python ...``) talk over that namespace's own
``127.0.0.1``; ``tc``'s token bucket filter on its loopback (``tbf rate R``) lets ``R`` bits per second through, in
both directions together (one queue: a half-duplex link of rate ``R``). Needs root (``CAP_NET_ADMIN``) and iproute2;
the namespace is removed on exit, also after an error.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import contextmanager
from typing import Iterator, List, Optional

PREFIX = "gnnpipe-tta-"


class LinkUnavailable(RuntimeError):
    """Network namespaces or traffic shaping are not permitted here."""


def _run(cmd: List[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise LinkUnavailable(f"`{' '.join(cmd)}` failed (exit {done.returncode}): {done.stderr.strip()}")


def shaping_args(rate_bits: float) -> List[str]:
    """``tc`` arguments of a token bucket of ``rate_bits`` bits/s: a burst of 10 ms of traffic (at least 256 KiB,
    above the loopback's 64 KiB MTU) and a queue of 100 ms (at least 1 MiB)."""
    rate_bytes = rate_bits / 8
    burst, limit = max(256 * 1024, int(rate_bytes * 0.01)), max(1 << 20, int(rate_bytes * 0.1))
    return ["tbf", "rate", f"{int(rate_bits)}bit", "burst", str(burst), "limit", str(limit)]


@contextmanager
def shaped_loopback(rate_bits: Optional[float], name: Optional[str] = None) -> Iterator[List[str]]:
    """Make a network namespace with its loopback up and shaped to ``rate_bits`` (``None``: unshaped); yield the
    command prefix that runs a process inside it; remove the namespace on exit.

    Raises:
        LinkUnavailable: ``ip`` or ``tc`` is missing or not permitted (not root), with the command's own message.
    """
    if shutil.which("ip") is None or shutil.which("tc") is None:
        raise LinkUnavailable("iproute2's `ip` and `tc` are needed to emulate a link (apt install iproute2).")
    name = name or f"{PREFIX}{os.getpid()}"
    _run(["ip", "netns", "add", name])
    try:
        _run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"])
        if rate_bits is not None:
            _run(["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", *shaping_args(rate_bits)])
        yield ["ip", "netns", "exec", name]
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def namespaces() -> List[str]:
    """Names of the network namespaces that exist now."""
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
