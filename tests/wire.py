"""Check every tensor handed to ``torch.distributed`` on CPU the way NCCL would refuse it, and spy on graph copies.

:class:`WireCheck` wraps the tensor-passing functions of ``torch.distributed`` (:data:`WRAPPED`) in the process that
enters it, under both the names ``torch.distributed.<op>`` and ``torch.distributed.distributed_c10d.<op>`` (the
functions look each other up there: ``P2POp`` and ``batch_isend_irecv`` compare ``op.op`` with ``isend``/``irecv``),
so it sees the package's own calls, Lightning's, those of ``torch.distributed.checkpoint``, the object collectives
(which pass byte tensors) and the ``isend``/``irecv`` of ``torch.distributed.pipelining``'s stages. Every tensor
argument must be contiguous, on the strategy's root device and of a dtype NCCL carries (:data:`NCCL_DTYPES`);
the first one that is not raises an ``AssertionError`` naming the call, before the call runs. Gloo takes tensors NCCL
refuses, so a CPU run under the check fails where a CUDA run would.

Forked or spawned ranks do not inherit a patch made in the parent after they start: enter the check inside the rank's
own function (:func:`wire_job`).

:class:`GraphTransferSpy` counts the bytes of every ``torch_geometric.data.Data.to`` call (Lightning moves a batch
with ``Data.to``): the host-to-device bytes of the graph a CUDA run would copy.
"""

from __future__ import annotations

import functools
import inspect
from collections import Counter, defaultdict
from typing import Any, Callable, Dict, Iterator, List, Optional, Set

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch import Tensor

WRAPPED = ("send", "recv", "isend", "irecv", "broadcast", "all_reduce", "reduce", "all_gather",
           "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "all_to_all_single", "all_to_all",
           "gather", "scatter", "batch_isend_irecv")
"""The ``torch.distributed`` functions that hand tensors to a process group."""

NCCL_DTYPES = frozenset([torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
                         torch.int32, torch.int64, torch.bool]
                        + [getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name)])
"""Dtypes ``ProcessGroupNCCL`` maps to an NCCL type (torch 2.13); ``int16``, ``uint16``, complex ... it refuses."""


def _tensors(value: Any) -> Iterator[Tensor]:
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, dist.P2POp):
                yield item.tensor
            else:
                yield from _tensors(item)


class WireCheck:
    """Context manager: wrap :data:`WRAPPED` and check every tensor passed to them.

    Args:
        device: The strategy's root device; every tensor must live there.

    Attributes:
        calls: Number of calls per function.
        dtypes: Dtypes seen per function.
        shapes: Shapes seen per function.
    """

    def __init__(self, device: Any = "cpu") -> None:
        self.device = torch.device(device)
        self.calls: Counter = Counter()
        self.dtypes: Dict[str, Set[torch.dtype]] = defaultdict(set)
        self.shapes: Dict[str, Set[tuple]] = defaultdict(set)
        self._saved: List[tuple] = []

    def check(self, op: str, tensor: Tensor, role: str) -> None:
        """Raise ``AssertionError`` if ``tensor`` (argument ``role`` of ``op``) would not travel under NCCL."""
        problems = []
        if not tensor.is_contiguous():
            problems.append(f"not contiguous (strides {tuple(tensor.stride())})")
        if tensor.device != self.device:
            problems.append(f"not on the root device {self.device}")
        if tensor.dtype not in NCCL_DTYPES:
            problems.append("a dtype NCCL does not carry")
        if problems:
            raise AssertionError(
                f"wire check: torch.distributed.{op} got `{role}` of shape {tuple(tensor.shape)}, dtype "
                f"{tensor.dtype}, device {tensor.device}: {'; '.join(problems)}")
        self.dtypes[op].add(tensor.dtype)
        self.shapes[op].add(tuple(tensor.shape))

    def _wrap(self, op: str, original: Callable) -> Callable:
        signature = inspect.signature(original)

        @functools.wraps(original)
        def checked(*args: Any, **kwargs: Any) -> Any:
            self.calls[op] += 1
            for role, value in signature.bind(*args, **kwargs).arguments.items():
                for tensor in _tensors(value):
                    self.check(op, tensor, role)
            return original(*args, **kwargs)

        return checked

    def __enter__(self) -> "WireCheck":
        for op in WRAPPED:
            original = getattr(c10d, op)
            wrapper = self._wrap(op, original)
            for namespace in (dist, c10d):
                self._saved.append((namespace, op, getattr(namespace, op)))
                setattr(namespace, op, wrapper)
        return self

    def __exit__(self, *exc: Any) -> None:
        for namespace, op, original in reversed(self._saved):
            setattr(namespace, op, original)
        self._saved = []

    def summary(self) -> Dict[str, Any]:
        """Plain values (picklable): calls and dtype names per function."""
        return {"calls": dict(self.calls), "dtypes": {op: sorted(str(d) for d in ds) for op, ds in self.dtypes.items()}}


class GraphTransferSpy:
    """Context manager: count the tensor bytes of every ``Data.to`` call (``bytes``) and the calls (``calls``)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.calls = 0
        self._original: Optional[Callable] = None

    def __enter__(self) -> "GraphTransferSpy":
        from torch_geometric.data import Data

        self._original = original = Data.to
        spy = self

        def to(data, *args: Any, **kwargs: Any):
            spy.calls += 1
            spy.bytes += sum(v.numel() * v.element_size() for _, v in data if isinstance(v, Tensor))
            return original(data, *args, **kwargs)

        Data.to = to
        return self

    def __exit__(self, *exc: Any) -> None:
        from torch_geometric.data import Data

        Data.to = self._original


def graph_bytes(data: Any) -> int:
    """Bytes of every tensor of a ``Data`` (what one host-to-device copy of it moves)."""
    return sum(v.numel() * v.element_size() for _, v in data if isinstance(v, Tensor))


def wire_job(runs: List[Dict[str, Any]], device: Any = None) -> Dict[str, Any]:
    """On one rank: every fit of ``runs`` (keyword arguments of :func:`tests.scenarios.fit_rank`, in order) under one
    :class:`WireCheck` and one :class:`GraphTransferSpy`.

    Args:
        runs: The fits.
        device: The root device (``None``: ``cuda:<LOCAL_RANK>`` if the first fit runs on ``accelerator="gpu"``,
            else the CPU).

    Returns:
        ``{"wire": WireCheck.summary(), "fits": [...]}``; per fit its ``losses``, the ``Data.to`` calls and bytes
        before training (``setup``: the strategy's setup) and during it (``training``: every step and validation),
        the optimizer ``steps`` taken and the module's final ``state`` (on the CPU).
    """
    import os

    if device is None:
        gpu = runs[0].get("accelerator") == "gpu"
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if gpu else torch.device("cpu")
    from lightning.pytorch import Callback

    from tests.scenarios import fit_rank

    class Marks(Callback):
        def __init__(self, spy: GraphTransferSpy) -> None:
            self.spy, self.at = spy, {}

        def on_train_start(self, trainer, pl_module):
            self.at["start"] = (self.spy.calls, self.spy.bytes, trainer.global_step)

        def on_train_end(self, trainer, pl_module):
            self.at["end"] = (self.spy.calls, self.spy.bytes, trainer.global_step)

    fits = []
    with WireCheck(device) as wire, GraphTransferSpy() as spy:
        for run in runs:
            marks, before = Marks(spy), (spy.calls, spy.bytes)
            out = fit_rank(**{**run, "callbacks": [marks] + list(run.get("callbacks", []))})
            start, end = marks.at["start"], marks.at["end"]
            state = {k: v.detach().cpu() for k, v in out["trainer"].lightning_module.state_dict().items()}
            fits.append({"losses": out["losses"], "setup": (start[0] - before[0], start[1] - before[1]),
                         "training": (end[0] - start[0], end[1] - start[1]), "steps": end[2] - start[2],
                         "state": state})
    return {"wire": wire.summary(), "fits": fits}
