"""The allocator settings of every rank: large blocks in their own mappings (``heap_mmap_threshold``), backed by
transparent huge pages (``huge_pages``)."""

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, GraphParallelStrategy
from lightning_gnnpipe import _compat
from lightning_gnnpipe.strategy import allocator
from lightning_gnnpipe.strategy.allocator import (DEFAULT_HEAP_MMAP_THRESHOLD, HEAP_THRESHOLD_ENV, HUGE_PAGES_ENV,
                                                  LAUNCHED_BY_ENV, apply_heap_mmap_threshold, started_by_strategy)
from lightning_gnnpipe.strategy.launcher import CheckedMultiProcessingLauncher, HugePageScriptLauncher
from tests.helpers import GCNModule, fit, sbm_graph
from tests.scenarios import warnings_job
from tests.world import run_world, values

MALLINFO = textwrap.dedent("""
    import ctypes, sys
    import torch

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                     "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Mallinfo2
""")

PROBE = MALLINFO + textwrap.dedent("""
    from lightning_gnnpipe.strategy.allocator import set_heap_mmap_threshold
    if sys.argv[1] == "fixed":
        assert set_heap_mmap_threshold(16 * 2**20) is None
    big = torch.empty(30 * 2**20, dtype=torch.uint8)
    del big  # a freed 30 MiB mapping: glibc's dynamic threshold follows it
    before = libc.mallinfo2().hblkhd
    t = torch.empty(20 * 2**20, dtype=torch.uint8)  # a chunk-sized tensor
    print(libc.mallinfo2().hblkhd - before)
""")


def _mapped_bytes(mode: str, probe: str = PROBE) -> int:
    """Run ``probe`` in a fresh interpreter with argument ``mode``; return the bytes it prints last."""
    out = subprocess.run([sys.executable, "-c", probe, mode], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2"),
                    reason="glibc >= 2.33 only")
def test_fixed_threshold_maps_a_chunk_sized_tensor_that_the_default_puts_on_the_heap():
    assert _mapped_bytes("default") == 0  # on the heap: its space stays with the process when freed
    assert _mapped_bytes("fixed") >= 20 * 2**20  # its own mapping: returned to the OS when freed


TRIM_PROBE = MALLINFO + textwrap.dedent("""
    from lightning_gnnpipe.strategy.allocator import M_MMAP_THRESHOLD, set_heap_mmap_threshold
    if sys.argv[1] == "package":
        assert set_heap_mmap_threshold(16 * 2**20) is None
    else:  # the mmap threshold alone
        assert libc.mallopt(M_MMAP_THRESHOLD, 16 * 2**20) == 1
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes, libc.sbrk.restype, libc.sbrk.argtypes = [ctypes.c_void_p], ctypes.c_void_p, [ctypes.c_ssize_t]
    size, held = 12 * 2**20, []
    for _ in range(8):  # below the threshold: from the main heap; the first may fill a hole, a later one is its top
        block = libc.malloc(size)
        ctypes.memset(block, 1, size)
        if libc.sbrk(0) - (block + size) < 2**20:
            break
        held.append(block)
    else:
        raise SystemExit("no block at the heap's top")
    top = libc.sbrk(0)
    libc.free(block)
    print(top - libc.sbrk(0))  # bytes the heap handed back to the OS when the block was freed
""")


@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2"),
                    reason="glibc >= 2.33 only")
def test_fixed_threshold_keeps_freed_heap_top_for_the_next_block():
    """With the mmap threshold alone, glibc's trim threshold stays at 128 KiB and a freed 12 MiB block at the heap's top
    goes back to the OS (``brk``, to be faulted in anew by the next one); the package also fixes the trim threshold at
    twice the mmap threshold, so the space stays."""
    assert _mapped_bytes("mmap-only", TRIM_PROBE) >= 12 * 2**20
    assert _mapped_bytes("package", TRIM_PROBE) < 12 * 2**20


EVAL_PROBE = MALLINFO + textwrap.dedent("""
    from lightning_gnnpipe.strategy.allocator import evaluation_heap, set_heap_mmap_threshold
    if sys.argv[1] == "fixed":
        assert set_heap_mmap_threshold(16 * 2**20) is None

    def mapped(nbytes):  # bytes in own mappings while a tensor of nbytes lives
        before = libc.mallinfo2().hblkhd
        t = torch.empty(nbytes, dtype=torch.uint8)
        return libc.mallinfo2().hblkhd - before

    before = mapped(24 * 2**20)
    with evaluation_heap():
        during = [mapped(24 * 2**20) for _ in range(3)]
        kept = libc.mallinfo2().fordblks  # the heap keeps the freed 24 MiB for the next one
    print(before, max(during), mapped(24 * 2**20), kept, libc.mallinfo2().arena)
""")


def _eval_heap(mode: str) -> list:
    out = subprocess.run([sys.executable, "-c", EVAL_PROBE, mode], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    return [int(v) for v in out.stdout.split()[-5:]]


@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2"),
                    reason="glibc >= 2.33 only")
def test_an_exact_forward_reuses_heap_blocks_and_the_fixed_threshold_returns():
    """Inside ``evaluation_heap`` a 24 MiB block (a chunk's rows at 1M nodes) comes from the heap and stays there when
    freed; after it the rank's fixed threshold maps such a block again and the heap's free space went back to the OS
    (its pages; the arena may keep its address range)."""
    before, during, after, kept, _ = _eval_heap("fixed")
    assert before >= 24 * 2**20 and after >= 24 * 2**20  # the rank's 16 MiB threshold: own mappings
    assert during == 0 and kept >= 24 * 2**20  # on the heap, and kept for the next block
    before, during, after, _, _ = _eval_heap("default")  # a process whose threshold the strategy did not fix
    assert before >= 24 * 2**20 and during == after == 0  # glibc's dynamic rule, left alone: raised by the first free


def _threshold_calls(tmp_path, monkeypatch, name, **run):
    """Fit in a forked world; return the thresholds its ranks set and the warnings rank 0 gave."""
    log = tmp_path / f"{name}.calls"

    def record(nbytes):
        with open(log, "a") as f:
            f.write(f"{nbytes}\n")
        return None

    monkeypatch.setattr(allocator, "set_heap_mmap_threshold", record)  # the forked ranks inherit it
    dm = GraphChunkDataModule(sbm_graph(200), num_chunks=2)
    told = values(run_world(2, warnings_job, GCNModule(16, 16, 4, 4), dm, 2, 1, **run))[0]
    return (log.read_text().split() if log.exists() else []), told


def test_ranks_the_strategy_started_set_the_threshold_others_warn(tmp_path, monkeypatch):
    """A rank of a launch the strategy made fixes the threshold; one that torchrun started (the forked world) leaves it
    as it is and says how to set it (as for the huge pages); ``heap_mmap_threshold=None`` does neither."""
    calls, told = _threshold_calls(tmp_path, monkeypatch, "torchrun")
    assert calls == [] and any(f"set {HEAP_THRESHOLD_ENV}={DEFAULT_HEAP_MMAP_THRESHOLD} in the environment" in w
                               for w in told)
    if os.environ.get(HUGE_PAGES_ENV) != "1":  # and torchrun started it without torch's huge pages
        assert any("`huge_pages=True` cannot act in rank 0: this process started with THP_MEM_ALLOC_ENABLE" in w
                   for w in told)
    monkeypatch.setenv(LAUNCHED_BY_ENV, str(os.getpid()))  # as the launchers mark the processes they start
    calls, told = _threshold_calls(tmp_path, monkeypatch, "launched")
    assert calls == [str(DEFAULT_HEAP_MMAP_THRESHOLD)] * 2 and not any("heap_mmap_threshold" in w for w in told)
    calls, told = _threshold_calls(tmp_path, monkeypatch, "none", strategy_cls=GraphParallelStrategy,
                                   strategy_kwargs={"heap_mmap_threshold": None})
    assert calls == [] and not any("heap_mmap_threshold" in w for w in told)


def test_threshold_only_in_processes_the_strategy_started(monkeypatch):
    calls = []
    monkeypatch.setattr(allocator, "set_heap_mmap_threshold", lambda n: calls.append(n) or "refused")
    mine, other = {LAUNCHED_BY_ENV: str(os.getpid())}, {LAUNCHED_BY_ENV: str(os.getpid() + 1)}
    assert not started_by_strategy({}) and not started_by_strategy(mine) and started_by_strategy(other)
    assert apply_heap_mmap_threshold(4096, other) == "refused" and calls == [4096]  # the reason is handed on
    assert "set MALLOC_MMAP_THRESHOLD_=4096 in the environment" in apply_heap_mmap_threshold(4096, mine)
    assert apply_heap_mmap_threshold(4096, {HEAP_THRESHOLD_ENV: "65536"}) is None  # set when the process started
    assert apply_heap_mmap_threshold(4096, {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}) is None
    assert calls == [4096]


@pytest.mark.parametrize("bad", [0, 2**30, 1.5, True, "16M"])
def test_bad_threshold_is_refused(bad):
    with pytest.raises(ValueError, match="heap_mmap_threshold"):
        GNNPipeStrategy(heap_mmap_threshold=bad)


HUGE_PAGE_PROBE = textwrap.dedent("""
    import re
    import torch
    t = torch.empty(64 * 2**20, dtype=torch.uint8).fill_(1)  # touched: every page faulted in
    rollup = open("/proc/self/smaps_rollup").read()
    print(int(re.search(r"AnonHugePages:\\s+(\\d+) kB", rollup).group(1)) * 1024)
""")


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "none"
    return text.split("[")[1].split("]")[0]


@pytest.mark.skipif(_thp_mode() not in ("madvise", "always"), reason="the kernel's transparent huge pages are off")
def test_a_process_started_with_the_variable_backs_large_tensors_with_huge_pages():
    """What ``huge_pages`` relies on: torch reads ``THP_MEM_ALLOC_ENABLE`` at start-up and madvises its blocks."""
    def huge_bytes(env):
        out = subprocess.run([sys.executable, "-c", HUGE_PAGE_PROBE], capture_output=True, text=True, timeout=120,
                             env=env)
        assert out.returncode == 0, out.stderr
        return int(out.stdout.split()[-1])

    plain = {k: v for k, v in os.environ.items() if k != HUGE_PAGES_ENV}
    assert huge_bytes({**plain, HUGE_PAGES_ENV: "1"}) >= 60 * 2**20  # of the 64 MiB tensor
    if _thp_mode() == "madvise":
        assert huge_bytes(plain) < 2**20


@pytest.mark.parametrize("launcher_cls,parent", [(CheckedMultiProcessingLauncher, _compat.MultiProcessingLauncher),
                                                 (HugePageScriptLauncher, _compat.SubprocessScriptLauncher)])
@pytest.mark.parametrize("huge_pages,preset,seen", [(True, None, "1"), (False, None, None), (True, "0", "0")])
def test_launchers_start_ranks_with_huge_pages(monkeypatch, launcher_cls, parent, huge_pages, preset, seen):
    """The spawn and popen launchers start their processes with ``THP_MEM_ALLOC_ENABLE=1`` (a value the user set
    stays) and their mark; under popen rank 0's fit, in the launching process, runs with the user's environment (so
    ``huge_pages`` warns there); afterwards the environment is as it was."""
    monkeypatch.delenv(HUGE_PAGES_ENV, raising=False)
    if preset is not None:
        monkeypatch.setenv(HUGE_PAGES_ENV, preset)
    started, in_fit = [], []

    def launch(self, fn, *a, **k):  # Lightning's: start the ranks (they copy the environment), then run rank 0's fit
        started.append((os.environ.get(HUGE_PAGES_ENV), os.environ.get(LAUNCHED_BY_ENV)))
        fn(lambda: in_fit.append((os.environ.get(HUGE_PAGES_ENV), os.environ.get(LAUNCHED_BY_ENV))))

    monkeypatch.setattr(parent, "launch", launch)
    strategy = GNNPipeStrategy(huge_pages=huge_pages)
    if launcher_cls is CheckedMultiProcessingLauncher:
        launcher = launcher_cls(strategy)
    else:
        launcher = launcher_cls(None, 2, 1, huge_pages=strategy.huge_pages)
    launcher.launch(lambda record: record(), trainer=None)
    assert started == [(seen, str(os.getpid()))]
    # spawn: the function runs in the spawned ranks, with what they started with; popen: in this process
    assert in_fit == started if launcher_cls is CheckedMultiProcessingLauncher else in_fit == [(preset, None)]
    assert os.environ.get(HUGE_PAGES_ENV) == preset and LAUNCHED_BY_ENV not in os.environ


def test_the_strategy_picks_the_popen_launcher_with_its_setting():
    from lightning.fabric.plugins.environments import LightningEnvironment

    strategy = GNNPipeStrategy(start_method="popen", huge_pages=False)
    strategy.cluster_environment = LightningEnvironment()
    strategy._configure_launcher()
    assert isinstance(strategy.launcher, HugePageScriptLauncher) and strategy.launcher.huge_pages is False


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_bad_huge_pages_is_refused(bad):
    with pytest.raises(ValueError, match=r"`huge_pages` must be True or False \(got "):
        GraphParallelStrategy(huge_pages=bad)


def test_release_shared_pages_drops_them_from_the_resident_set_and_keeps_the_data():
    import psutil
    import torch

    from lightning_gnnpipe.strategy.allocator import release_shared_pages

    process = psutil.Process()
    shared = torch.randn(2**24).share_memory_()  # 64 MiB, every page touched
    private = torch.randn(2**22)
    total, before = float(shared.sum()), process.memory_info().rss
    released = release_shared_pages([shared, private, None, shared])  # private memory would lose data: skipped
    after = process.memory_info().rss
    assert 64 * 2**20 - 8192 <= released <= 64 * 2**20
    assert before - after > 60 * 2**20
    assert float(shared.sum()) == total and torch.isfinite(private).all()  # the shared pages come back on read
    assert release_shared_pages([private]) == 0


def test_huge_pages_unavailable_says_why(tmp_path):
    from lightning_gnnpipe.strategy.allocator import huge_pages_unavailable

    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    assert huge_pages_unavailable({HUGE_PAGES_ENV: "1"}, str(setting)) is None
    assert "started with THP_MEM_ALLOC_ENABLE=None" in huge_pages_unavailable({}, str(setting))
    assert "started with THP_MEM_ALLOC_ENABLE='0'" in huge_pages_unavailable({HUGE_PAGES_ENV: "0"}, str(setting))
    setting.write_text("always madvise [never]\n")
    assert "transparent huge pages are off" in huge_pages_unavailable({HUGE_PAGES_ENV: "1"}, str(setting))


def test_spawned_ranks_let_go_of_the_graph_they_no_longer_read(tmp_path):
    """Spawned ranks get the graph in shared memory. After building their chunk graphs both release the edge list's
    pages, and stage 1 the features' too (only stage 0 reads them); a forked world (private memory) releases none."""
    graph = sbm_graph(num_nodes=2000)
    dm = GraphChunkDataModule(graph, num_chunks=4)
    edges, features = (t.untyped_storage().nbytes() for t in (graph.edge_index, graph.x))
    metrics = fit(str(tmp_path / "spawn"), GCNModule(16, 8, 2, 4), dm, devices=2, strategy=GNNPipeStrategy(),
                  epochs=2, launcher="spawn", limit_val_batches=0)  # (the insight logs after the recorder reads)
    released = [metrics[0][-1][f"memory/released_graph_bytes/rank{r}"] for r in range(2)]
    assert edges - 8192 <= released[0] <= edges
    assert edges + features - 16384 <= released[1] <= edges + features
    private = sbm_graph(num_nodes=2000)  # (the spawn launch above moved `graph` into shared memory)
    assert not private.edge_index.is_shared()
    forked = fit(str(tmp_path / "fork"), GCNModule(16, 8, 2, 4), GraphChunkDataModule(private, num_chunks=4),
                 devices=2, strategy=GNNPipeStrategy(),
                 epochs=2, limit_val_batches=0)
    assert [forked[0][-1][f"memory/released_graph_bytes/rank{r}"] for r in range(2)] == [0.0, 0.0]
