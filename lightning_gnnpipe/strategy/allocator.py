"""The allocator settings of the ranks: large tensors in their own memory mappings (glibc ``M_MMAP_THRESHOLD``),
backed by transparent huge pages (torch's ``THP_MEM_ALLOC_ENABLE``).

On Linux, torch's CPU tensors come from glibc ``malloc``. A block of at least ``M_MMAP_THRESHOLD`` bytes gets its own
``mmap`` and goes back to the OS when it is freed; a smaller one comes from the heap, whose freed space is kept for
later requests. glibc raises the threshold dynamically, up to 32 MiB, whenever a mapped block is freed. A pipeline
stage allocates and frees many tensors of one chunk's rows (about ``|V| / K x d`` floats: 30.5 MiB for 125,000 rows
of width 64) in an order the heap cannot pack, so with the dynamic threshold its heap grows well past what is alive.
A fixed threshold keeps the heap small, but every chunk-sized tensor is then a fresh mapping, faulted in page by page
(4 KiB pages): on the 1,000,000-node graph of ``docs/results/scale.md`` that made the epoch 17-24% slower. torch
advises its CPU blocks of 2 MiB and more as transparent huge pages when its environment variable
``THP_MEM_ALLOC_ENABLE=1`` is set at the start of the process; then a fault maps 2 MiB at once. The strategies set it
for the ranks they start (``huge_pages``); with it, the threshold changed neither epoch time nor memory on that graph.
With the threshold glibc's trim threshold is fixed too, at twice it (glibc's own pairing): left at its initial 128 KiB,
the heap hands its top back to the OS and faults it in again chunk after chunk (GCNII-16 at 300k nodes: training
step 10% longer).
Measured figures, with the commands: ``docs/results/notes/memory.md``.

An exact forward (evaluation, a history refresh) is the exception (:func:`evaluation_heap`): it keeps nothing for a
backward pass, so its chunk-sized temporaries come from the heap while it runs, at glibc's largest threshold (32 MiB),
and are reused chunk after chunk instead of faulted in anew; the heap's free pages go back to the OS when it ends.

Both settings last as long as the process: torch reads ``THP_MEM_ALLOC_ENABLE`` when it starts, and glibc can neither
report a fixed threshold nor go back to its dynamic one. So the strategies apply them only in the processes their
launchers start (:func:`launch_environment`, :func:`started_by_strategy`), never in one the user owns (the process
that calls ``fit``, ranks started by torchrun or SLURM): there the job's environment sets them when the process starts
(``THP_MEM_ALLOC_ENABLE=1``, ``MALLOC_MMAP_THRESHOLD_=16777216``), and the strategies warn where it does not.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterable, Iterator, Mapping, Optional

from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h>

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


def _libc_function(name: str, argtypes: list, restype: Any) -> Optional[Callable[..., int]]:
    """The C library's function ``name`` with its ctypes signature; ``None`` off Linux or where it lacks it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):  # musl and other C libraries without it
        return None
    function.argtypes, function.restype = argtypes, restype
    return function


def _mallopt() -> Optional[Callable[[int, int], int]]:
    return _libc_function("mallopt", [ctypes.c_int, ctypes.c_int], ctypes.c_int)


def set_heap_mmap_threshold(nbytes: int) -> Optional[str]:
    """Fix glibc's ``M_MMAP_THRESHOLD`` of this process to ``nbytes`` and its ``M_TRIM_THRESHOLD`` to ``2 * nbytes``
    (``mallopt``; no dynamic raise afterwards).

    The trim threshold is what glibc's dynamic rule pairs with a threshold of ``nbytes``: the heap keeps up to twice
    that much free space at its top instead of handing it back (``brk``) and faulting it in again at the next
    allocation, which the fixed threshold alone would leave at glibc's initial 128 KiB.
    For good: glibc keeps no way to read the thresholds back, and once fixed they never return to the dynamic ones
    (``mallopt(3)``). The strategies call it only through :func:`apply_heap_mmap_threshold`.

    Returns:
        ``None`` if set; otherwise why not (off Linux, a C library without ``mallopt``, or glibc refused the value).
    """
    if not sys.platform.startswith("linux"):
        return "glibc's mallopt exists on Linux only"
    mallopt = _mallopt()
    if mallopt is None:
        return "this C library has no mallopt (it is not glibc)"
    if not mallopt(M_MMAP_THRESHOLD, int(nbytes)):
        return f"glibc refused mallopt(M_MMAP_THRESHOLD, {int(nbytes)})"
    if not mallopt(M_TRIM_THRESHOLD, 2 * int(nbytes)):
        return f"glibc refused mallopt(M_TRIM_THRESHOLD, {2 * int(nbytes)})"
    global _fixed_threshold
    _fixed_threshold = int(nbytes)
    return None


_fixed_threshold: Optional[int] = None  # the threshold set_heap_mmap_threshold fixed in this process, if any

EVALUATION_HEAP_THRESHOLD = 32 * 2**20
"""Bytes: during an exact forward, blocks below this size (glibc's largest threshold) come from the heap."""


@contextmanager
def evaluation_heap() -> Iterator[None]:
    """While open, blocks below :data:`EVALUATION_HEAP_THRESHOLD` come from glibc's heap, which keeps its freed space;
    on exit the rank's threshold is fixed again and the heap's free pages go back to the OS (``malloc_trim(0)``).

    An exact forward (evaluation, a history refresh) runs without autograd, so its temporaries die layer by layer and
    the same sizes come back chunk after chunk: from the heap they are reused without a page fault, where each fresh
    mapping of the rank's fixed threshold is faulted in again. Only where this process's threshold was fixed
    (:func:`set_heap_mmap_threshold`: the ranks the strategies start); elsewhere nothing changes. Tensors of 16 to
    32 MiB made inside and kept afterwards stay on the heap. Raises nothing.

    Source: glibc's ``mallopt(3)`` (``M_MMAP_THRESHOLD``, ``M_TRIM_THRESHOLD``) and ``malloc_trim(3)``.
    """
    fixed, mallopt = _fixed_threshold, _mallopt()
    if fixed is None or fixed >= EVALUATION_HEAP_THRESHOLD or mallopt is None:
        yield
        return
    mallopt(M_MMAP_THRESHOLD, EVALUATION_HEAP_THRESHOLD)
    mallopt(M_TRIM_THRESHOLD, 2**31 - 1)
    try:
        yield
    finally:
        set_heap_mmap_threshold(fixed)
        trim_heap()


HEAP_THRESHOLD_ENV = "MALLOC_MMAP_THRESHOLD_"
"""glibc's environment variable for the same threshold, read once, when a process starts (``mallopt(3)``)."""


def apply_heap_mmap_threshold(nbytes: int, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Fix the threshold at ``nbytes`` (:func:`set_heap_mmap_threshold`) if a launcher of the strategies started this
    process; return why it is not fixed, or ``None``.

    Fixing it cannot be undone, so it is done only in processes the strategies' launchers started
    (:func:`started_by_strategy`: spawn's ranks, which end with the fit; popen's ranks other than 0, copies of the
    user's script), never in a process the user owns: the one that calls ``fit`` (popen's rank 0) or a rank that
    torchrun or SLURM started. There the environment can set it when the process starts (:data:`HEAP_THRESHOLD_ENV`,
    or ``glibc.malloc.mmap_threshold`` in ``GLIBC_TUNABLES``); if it does, ``None`` is returned.

    Args:
        nbytes: Bytes.
        environ: This process's environment (default: ``os.environ``; tests pass another).
    """
    env = os.environ if environ is None else environ
    if started_by_strategy(env):
        return set_heap_mmap_threshold(nbytes)
    if HEAP_THRESHOLD_ENV in env or "glibc.malloc.mmap_threshold" in env.get("GLIBC_TUNABLES", ""):
        return None
    return (f"the strategy did not start this process (it calls fit, or torchrun or SLURM started it) and cannot "
            f"undo the setting in it; set {HEAP_THRESHOLD_ENV}={nbytes} in the environment that starts it, or pass "
            "heap_mmap_threshold=None")


HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"
"""torch's switch (read once, at a process's first CPU allocation): ``madvise(MADV_HUGEPAGE)`` on blocks >= 2 MiB."""


LAUNCHED_BY_ENV = "LIGHTNING_GNNPIPE_LAUNCHED_BY"
"""Set by the strategies' launchers in the environment of the processes they start: the launching process's id."""


def started_by_strategy(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether a launcher of the strategies started this process (:func:`launch_environment`).

    True in spawn's ranks and popen's ranks other than 0; false in the process that calls ``fit`` and in ranks that
    torchrun or SLURM started.

    Args:
        environ: This process's environment (default: ``os.environ``).
    """
    value = (os.environ if environ is None else environ).get(LAUNCHED_BY_ENV)
    return value is not None and value != str(os.getpid())


@contextmanager
def launch_environment(huge_pages: bool = True) -> Iterator[Callable[[], None]]:
    """While open, processes started from this one get :data:`LAUNCHED_BY_ENV` (this process's id) and, with
    ``huge_pages``, ``THP_MEM_ALLOC_ENABLE=1`` in their environment.

    ``THP_MEM_ALLOC_ENABLE`` takes effect only in a process that starts after it is set (torch reads it once), and
    only where the kernel's ``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise`` or ``always``. A value
    already in the environment (the user's own, ``0`` included) is left as it is.

    Source: torch's CPU allocator (``c10/core/alloc_cpu.cpp``, ``THP_MEM_ALLOC_ENABLE``), torch 2.13. Raises nothing.

    Yields:
        A function that gives this process its environment back at once (the popen launcher calls it when its ranks
        have started, before rank 0's fit runs in this process); on exit the environment is as before either way.
    """
    saved = {key: os.environ.get(key) for key in (LAUNCHED_BY_ENV, HUGE_PAGES_ENV)}

    def restore() -> None:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    os.environ[LAUNCHED_BY_ENV] = str(os.getpid())
    if huge_pages and saved[HUGE_PAGES_ENV] is None:
        os.environ[HUGE_PAGES_ENV] = "1"
    try:
        yield restore
    finally:
        restore()


THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_pages_unavailable(environ: Optional[dict] = None, setting: str = THP_SETTING) -> Optional[str]:
    """Say why torch's transparent huge pages are off in this process, or ``None`` when they are on.

    torch reads ``THP_MEM_ALLOC_ENABLE`` once, at the process's first CPU allocation, so a process started without it
    (by torchrun, SLURM, or the user's own process under the popen launcher) cannot turn them on any more; and the
    kernel honours them only when ``/sys/kernel/mm/transparent_hugepage/enabled`` is ``[always]`` or ``[madvise]``.

    Args:
        environ: The environment to read (default: this process's).
        setting: The kernel's setting file (tests pass another).
    """
    value = (os.environ if environ is None else environ).get(HUGE_PAGES_ENV)
    if value != "1":
        return (f"this process started with {HUGE_PAGES_ENV}={value!r}, and torch reads it only at start; set "
                f"{HUGE_PAGES_ENV}=1 in the environment that starts it (the job script under torchrun or SLURM)")
    try:
        with open(setting) as f:
            mode = f.read()
    except OSError:
        return None if sys.platform.startswith("linux") else "transparent huge pages exist on Linux only"
    if "[never]" in mode:
        return f"the kernel's transparent huge pages are off ({setting}: {mode.strip()})"
    return None


def rank_allocator_settings(heap_mmap_threshold: Optional[int], huge_pages: bool) -> Dict[str, str]:
    """Apply a rank's allocator options in its own process; return, by option, why one cannot act there.

    Args:
        heap_mmap_threshold: Bytes (:func:`apply_heap_mmap_threshold`), or ``None``: nothing to apply.
        huge_pages: Whether this process should run with torch's huge pages (:func:`huge_pages_unavailable`).

    Returns:
        ``{"heap_mmap_threshold": why, "huge_pages=True": why}``, only the options that cannot act.
    """
    heap = None if heap_mmap_threshold is None else apply_heap_mmap_threshold(heap_mmap_threshold)
    why = {"heap_mmap_threshold": heap, "huge_pages=True": huge_pages_unavailable() if huge_pages else None}
    return {option: reason for option, reason in why.items() if reason is not None}


def warn_unset_settings(owner: str, rank: int, unset: Mapping[str, str]) -> None:
    """Warn once, from rank 0, in one line, every option of :func:`rank_allocator_settings` that cannot act in this
    rank and why (nothing if all act)."""
    if unset:
        rank_zero_warn(f"{owner}: " + "; ".join(f"`{option}` cannot act in rank {rank}: {why}"
                                                 for option, why in unset.items()) + ".")


MADV_DONTNEED = 4  # <sys/mman.h>, Linux


def release_shared_pages(tensors: Iterable[Optional[Tensor]]) -> int:
    """Drop this process's page mappings of shared-memory CPU tensors it no longer reads (``madvise(MADV_DONTNEED)``).

    Tensors handed to spawned ranks live in shared memory; a rank that read them (to build its chunk graphs) keeps
    their pages in its resident set (RSS, PSS) although it no longer needs them. Releasing them keeps the data: the
    memory is shared, so a later read maps the same pages again. Tensors that are not shared (private memory: forked
    or torchrun ranks, GPU tensors) are left alone: there the call would discard data.

    Args:
        tensors: Candidates; ``None`` and non-shared ones are skipped.

    Returns:
        Bytes whose pages were released (whole pages inside each storage); 0 off Linux.
    """
    madvise = _libc_function("madvise", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int)
    if madvise is None:
        return 0
    page, released, seen = mmap.PAGESIZE, 0, set()
    for t in tensors:
        if t is None or t.device.type != "cpu" or not t.is_shared():
            continue
        storage = t.untyped_storage()
        start = storage.data_ptr()
        if start in seen:
            continue
        seen.add(start)
        first, last = -(-start // page) * page, (start + storage.nbytes()) // page * page
        if last > first and madvise(first, last - first, MADV_DONTNEED) == 0:
            released += last - first
    return released


def trim_heap() -> bool:
    """Return the free memory at the top of glibc's heaps to the OS (``malloc_trim(0)``); ``False`` without glibc."""
    trim = _libc_function("malloc_trim", [ctypes.c_size_t], ctypes.c_int)
    if trim is None:
        return False
    trim(0)
    return True
