"""The heap setting of every rank: large tensors in their own memory mappings (glibc ``M_MMAP_THRESHOLD``).

On Linux, torch's CPU tensors come from glibc ``malloc``. A block of at least ``M_MMAP_THRESHOLD`` bytes gets its own
``mmap`` and goes back to the OS when it is freed; a smaller one comes from the heap, whose freed space is kept for
later requests. glibc raises the threshold dynamically, up to 32 MiB, whenever a mapped block is freed. A pipeline
stage allocates and frees many tensors of one chunk's rows (about ``|V| / K x d`` floats: 30.5 MiB for 125,000 rows
of width 64) in an order the heap cannot pack, so with the dynamic threshold its heap grows well past what is alive.
Measured on the 1,000,000-node graph of ``docs/results/scale.md`` (GCN-8, ``K = 8``, 1F1B, 2 processes): peak RSS of
the largest rank 4.65 GiB with glibc's default, 3.16 GiB with a fixed 16 MiB threshold, epoch time 34.7 s and 32.7 s
(``docs/results/notes/memory.md``, with the commands). The strategies fix the threshold in every rank
(``heap_mmap_threshold``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Optional

M_MMAP_THRESHOLD = -3  # glibc <malloc.h>

DEFAULT_HEAP_MMAP_THRESHOLD = 16 * 2**20
"""Bytes: blocks from this size on get their own mapping in every rank (16 MiB)."""


def check_heap_mmap_threshold(value: object, owner: str) -> Optional[int]:
    """Return ``value`` if it is ``None`` or an int of bytes in ``[4096, 32 MiB]``.

    Raises:
        ValueError: Otherwise (glibc accepts at most 32 MiB on 64-bit Linux).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 4096 <= value <= 32 * 2**20:
        raise ValueError(f"{owner}: `heap_mmap_threshold` must be None or an int of bytes in [4096, 33554432] "
                         f"(32 MiB, glibc's maximum) (got {value!r}). Default: {DEFAULT_HEAP_MMAP_THRESHOLD} (16 MiB).")
    return value


def set_heap_mmap_threshold(nbytes: int) -> bool:
    """Fix glibc's ``M_MMAP_THRESHOLD`` of this process to ``nbytes`` (``mallopt``; no dynamic raise afterwards).

    Returns:
        ``True`` if set; ``False`` off Linux or without glibc (nothing changes).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries without mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, int(nbytes)))
