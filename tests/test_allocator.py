"""The heap setting of every rank (``heap_mmap_threshold``): large blocks in their own mappings."""

import ctypes
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, GraphParallelStrategy
from lightning_gnnpipe.strategy import base
from lightning_gnnpipe.strategy.allocator import DEFAULT_HEAP_MMAP_THRESHOLD
from tests.helpers import GCNModule, fit, sbm_graph

PROBE = textwrap.dedent("""
    import ctypes, sys
    import torch
    from lightning_gnnpipe.strategy.allocator import set_heap_mmap_threshold

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                     "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Mallinfo2
    if sys.argv[1] == "fixed":
        assert set_heap_mmap_threshold(16 * 2**20)
    big = torch.empty(30 * 2**20, dtype=torch.uint8)
    del big  # a freed 30 MiB mapping: glibc's dynamic threshold follows it
    before = libc.mallinfo2().hblkhd
    t = torch.empty(20 * 2**20, dtype=torch.uint8)  # a chunk-sized tensor
    print(libc.mallinfo2().hblkhd - before)
""")


def _mapped_bytes(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2"),
                    reason="glibc >= 2.33 only")
def test_fixed_threshold_maps_a_chunk_sized_tensor_that_the_default_puts_on_the_heap():
    assert _mapped_bytes("default") == 0  # on the heap: its space stays with the process when freed
    assert _mapped_bytes("fixed") >= 20 * 2**20  # its own mapping: returned to the OS when freed


def test_every_rank_sets_the_threshold_before_training(tmp_path, monkeypatch):
    log = tmp_path / "calls"

    def record(nbytes):
        with open(log, "a") as f:
            f.write(f"{nbytes}\n")
        return True

    monkeypatch.setattr(base, "set_heap_mmap_threshold", record)  # the forked ranks inherit it
    dm = GraphChunkDataModule(sbm_graph(200), num_chunks=2)
    fit(str(tmp_path / "a"), GCNModule(16, 16, 4, 4), dm, devices=2, strategy=GNNPipeStrategy(), epochs=1)
    assert log.read_text().split() == [str(DEFAULT_HEAP_MMAP_THRESHOLD)] * 2
    log.unlink()
    fit(str(tmp_path / "b"), GCNModule(16, 16, 4, 4), dm, devices=2,
        strategy=GraphParallelStrategy(heap_mmap_threshold=None), epochs=1)
    assert not log.exists()


@pytest.mark.parametrize("bad", [0, 2**30, 1.5, True, "16M"])
def test_bad_threshold_is_refused(bad):
    with pytest.raises(ValueError, match="heap_mmap_threshold"):
        GNNPipeStrategy(heap_mmap_threshold=bad)
