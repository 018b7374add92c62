"""A fit leaves its process as it found it (``lightning_gnnpipe/strategy/process_state.py``).

Each rank of a forked world (the torchrun way: the user's own processes) records the process-wide settings the
strategies touch before ``fit``, at the end of the training epoch and after ``fit``: after must equal before, and the
mid-fit record shows that the change was made (so the comparison could fail).
"""

import ctypes
import os
import warnings
from typing import Any, Dict, Optional

import pytest
import torch
from lightning.pytorch import Callback
from torchmetrics import Metric

from lightning_gnnpipe import GraphChunkDataModule, GraphParallelStrategy
from lightning_gnnpipe.nn import dropout
from lightning_gnnpipe.strategy.failures import NCCL_ERROR_HANDLING
from lightning_gnnpipe.strategy.process_state import quiet_sync_dist_advice
from tests.helpers import sbm_graph
from tests.precision_helpers import MetricGCN
from tests.scenarios import fit_rank
from tests.world import run_world, values


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                              "uordblks", "fordblks", "keepcost")]


def heap_threshold_is_dynamic() -> Optional[bool]:
    """Whether glibc's mmap threshold still follows freed blocks (``None`` without glibc >= 2.33's ``mallinfo2``).

    A freed 30 MiB mapping raises a dynamic threshold to 30 MiB, so the next 20 MiB block comes from the heap; under
    a threshold fixed below 20 MiB (``mallopt``) it gets a mapping of its own.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _Mallinfo2
    big = torch.empty(30 * 2**20, dtype=torch.uint8)
    del big
    before = mallinfo2().hblkhd
    block = torch.empty(20 * 2**20, dtype=torch.uint8)
    mapped = mallinfo2().hblkhd - before
    del block
    return mapped == 0


def _settings(module) -> Dict[str, Any]:
    return {"warning filters": list(warnings.filters),
            "metric groups": [m.process_group for m in module.modules() if isinstance(m, Metric)],
            "NCCL error handling": os.environ.get(NCCL_ERROR_HANDLING),
            "NodeDropout rows": dropout._ROWS.get()}


class _MidFit(Callback):
    def __init__(self) -> None:
        self.settings: Dict[str, Any] = {}

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.settings = _settings(pl_module)


def settings_job(module, datamodule, **kwargs) -> Dict[str, Any]:
    """Fit on this rank; per setting, whether it is back after the fit and whether the fit changed it meanwhile."""
    dynamic = heap_threshold_is_dynamic()
    before, mid = _settings(module), _MidFit()
    fit_rank(module, datamodule, 2, 1, callbacks=[mid], **kwargs)
    after = _settings(module)
    out = {key: {"restored": after[key] == before[key], "changed": mid.settings[key] != before[key]} for key in before}
    out["heap threshold"] = {"dynamic before": dynamic, "dynamic after": heap_threshold_is_dynamic()}
    return out


@pytest.mark.parametrize("strategy_cls", [None, GraphParallelStrategy], ids=["gnnpipe", "graph_parallel"])
def test_a_fit_leaves_the_process_as_it_found_it(strategy_cls):
    dm = GraphChunkDataModule(sbm_graph(200), num_chunks=2)
    for rank in values(run_world(2, settings_job, MetricGCN(16, 16, 2, 4), dm, strategy_cls=strategy_cls)):
        for key in ("warning filters", "metric groups"):  # changed for the fit, given back at teardown
            assert rank[key] == {"restored": True, "changed": True}, key
        for key in ("NCCL error handling", "NodeDropout rows"):  # gloo: never set; the rows: only inside a block call
            assert rank[key] == {"restored": True, "changed": False}, key
        heap = rank["heap threshold"]  # never fixed in a process the strategy did not start
        assert heap["dynamic after"] == heap["dynamic before"]
        assert heap["dynamic before"] in (True, None)  # (None: no mallinfo2 to tell)


def test_the_sync_dist_filter_leaves_other_filters_in_place():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        before = list(warnings.filters)
        undo = quiet_sync_dist_advice()
        assert len(warnings.filters) == len(before) + 1
        warnings.simplefilter("error", FutureWarning)  # the user adds one during the fit: it stays
        mine = warnings.filters[0]
        undo()
        assert warnings.filters == [mine] + before
        undo = quiet_sync_dist_advice()  # an equal entry already there: nothing added, nothing removed, same order
        again = quiet_sync_dist_advice()
        undo_twice = list(warnings.filters)
        again()
        assert warnings.filters == undo_twice
        undo()
        assert warnings.filters == [mine] + before


def test_node_rows_are_reset_after_an_error():
    from lightning_gnnpipe.nn import node_rows

    with pytest.raises(RuntimeError, match="inside"):
        with node_rows(torch.arange(3), epoch=1):
            assert dropout._ROWS.get() is not None
            raise RuntimeError("inside")
    assert dropout._ROWS.get() is None


def test_lightnings_leafspec_deprecation_is_silenced_only_for_its_message():
    """torch 2.13 warns (FutureWarning) at every ``LeafSpec()`` Lightning 2.6's CombinedLoader builds; importing
    lightning_gnnpipe silences that message, and only it (a fresh interpreter: pytest resets warning filters)."""
    import subprocess
    import sys

    code = """
import warnings
from lightning.pytorch.utilities._pytree import _tree_flatten
def flatten():
    with warnings.catch_warnings(record=True) as caught:
        warnings.filterwarnings("always", append=True)  # every time, after the filters already there
        _tree_flatten(1)
        warnings.warn("another FutureWarning", FutureWarning)
    return [type(w.message).__name__ + ": " + str(w.message)[:40] for w in caught]
print(flatten())
import lightning_gnnpipe
print(flatten())
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}  # conftest.py quiets the suite's processes
    before, after = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                   timeout=120, env=env).stdout.strip().splitlines()
    assert after == "['FutureWarning: another FutureWarning']"
    if torch.__version__ >= "2.13":  # the message the filter names is the one torch gives
        assert "FutureWarning: `isinstance(treespec, LeafSpec)` is depr" in before
