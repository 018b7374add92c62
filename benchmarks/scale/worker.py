"""One measured run of ``benchmarks/scale/run.py``, in its own process (``python -m benchmarks.scale.worker SPEC RUN_DIR``).

``SPEC`` is a JSON object: the graph (``nodes``, ``blocks``, ``degree``, ``features``, ``classes``, ``p_in``,
``seed``), the model (``model`` = ``gcn`` | ``sage``, ``layers``, ``hidden``), ``epochs`` and ``mode``:

* ``pyg_edge_index``: a plain PyTorch loop, ``model(x, edge_index)``;
* ``pyg_csr``: the same loop on a CSR ``adj_t`` (GCN: ``gcn_norm`` baked into the values, convs with
  ``normalize=False``; SAGE: unweighted, mean aggregation by ``spmm``); the edge list is freed;
* ``trainer_single``: ``Trainer(devices=1)`` on :class:`ScaleModule`, ``GraphChunkDataModule(num_chunks=1)``;
* ``gnnpipe_default``: ``Trainer(devices=2, strategy=GNNPipeStrategy())`` with every default and the ordinary module
  (no ``pipeline_chunk_loss``), ``num_chunks=8``: what a user who passes the strategy gets;
* ``gnnpipe_k8`` / ``gnnpipe_k16``: ``GNNPipeStrategy(schedule="gpipe")``, ``num_chunks`` 8 / 16;
* ``gnnpipe_1f1b_k8``: the same with ``schedule="1f1b"`` (at most about ``S`` chunks' activations alive), K = 8;
* ``gnnpipe_ckpt_k8`` / ``gnnpipe_1f1b_ckpt_k8``: GPipe / 1F1B, K = 8, ``activation_checkpointing=True``;
* ``gnnpipe_1f1b_bf16h_k8``: 1F1B, K = 8, ``history_dtype="bfloat16"`` (history tables in half the bytes);
* ``graph_parallel``: ``Trainer(devices=2, strategy=GraphParallelStrategy())``, ``num_chunks=2``;
* ``planner``: no training; the package planner's estimates for this graph and model (``spec["planner"]``
  holds the measured per-layer seconds and bandwidth it needs).

Optional ``strategy_kwargs``: more options of the 2-process modes' strategy, e.g. ``{"heap_mmap_threshold": null}``
(glibc's dynamic heap threshold instead of the strategies' 16 MiB). 2-process runs also record, per rank at the end
of the last epoch, the bytes it keeps by kind (:mod:`scale_breakdown`) and its USS / PSS / RSS then, at the peak and
after ``malloc_trim(0)`` (``result["breakdown"]``).

Writes ``RUN_DIR/result.json`` (epoch seconds, bytes sent per epoch, losses, setup seconds, versions) and, from
every process, ``RUN_DIR/mem_<role>.json`` (peak memory, :class:`benchmarks.harness.memory.MemorySampler`).
"""

from __future__ import annotations

import ctypes
import functools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import List, Optional

import psutil
import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, Trainer
from torch_geometric.data import Data

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.harness.memory import MemorySampler  # noqa: E402
from benchmarks.scale.breakdown import rank_breakdown  # noqa: E402
from benchmarks.scale.graph import build_model, csr_adjacency, graph_from_spec, sbm  # noqa: E402
from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, GraphParallelStrategy  # noqa: E402
from lightning_gnnpipe.planner.cost import measure_bandwidth as planner_bandwidth  # noqa: E402
from tests.helpers import ChunkLossGCN, GNNModule  # noqa: E402  (ordinary PyG LightningModules, as users write them)

THREADS_SINGLE = 2  # intra-op threads of the single-process modes (the machine's 2 cores; spec "threads_single")
THREADS_RANK = 1  # per process of the 2-process modes
TWO_PROCESS = {"gnnpipe_default": 8, "gnnpipe_k8": 8, "gnnpipe_k16": 16, "gnnpipe_1f1b_k8": 8, "gnnpipe_ckpt_k8": 8,
               "gnnpipe_1f1b_ckpt_k8": 8, "gnnpipe_1f1b_bf16h_k8": 8, "graph_parallel": 2}  # mode -> num_chunks
STRATEGIES = {  # mode -> strategy factory
    "gnnpipe_default": GNNPipeStrategy,
    "gnnpipe_k8": functools.partial(GNNPipeStrategy, schedule="gpipe"),
    "gnnpipe_k16": functools.partial(GNNPipeStrategy, schedule="gpipe"),
    "gnnpipe_1f1b_k8": functools.partial(GNNPipeStrategy, schedule="1f1b"),
    "gnnpipe_ckpt_k8": functools.partial(GNNPipeStrategy, activation_checkpointing=True),
    "gnnpipe_1f1b_ckpt_k8": functools.partial(GNNPipeStrategy, schedule="1f1b", activation_checkpointing=True),
    "gnnpipe_1f1b_bf16h_k8": functools.partial(GNNPipeStrategy, schedule="1f1b", history_dtype="bfloat16"),
    "graph_parallel": GraphParallelStrategy,
}


class ScaleModule(GNNModule):
    """The tests' ordinary PyG LightningModule around a model built by the caller (Adam, cross-entropy on the train
    mask), with the per-chunk loss that the 1F1B schedule needs."""

    pipeline_chunk_loss = ChunkLossGCN.pipeline_chunk_loss


class Probe(Callback):
    """Per rank: threads, a memory sampler (2-process runs), epoch seconds and rank 0's logged metrics.

    Writes ``<run_dir>/epochs_rank<r>.json`` at the end of the fit.
    """

    def __init__(self, run_dir: str, threads: int) -> None:
        self.run_dir, self.threads = Path(run_dir), threads
        self.epochs: List[dict] = []
        self.sampler: Optional[MemorySampler] = None
        self.bandwidth: Optional[float] = None

    def setup(self, trainer, pl_module, stage):
        torch.set_num_threads(self.threads)
        if trainer.world_size > 1:  # a spawned rank; the launching process samples itself
            self.sampler = MemorySampler(self.run_dir / f"mem_rank{trainer.global_rank}.json").start()
            self.bandwidth = measure_bandwidth(trainer)

    def on_train_epoch_start(self, trainer, pl_module):
        self._t0 = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module):
        row = {"epoch_s": time.perf_counter() - self._t0}
        if self.sampler is not None:  # what this rank keeps, by kind, and its memory now (bytes)
            row["kept_bytes"] = rank_breakdown(trainer)
            info = psutil.Process().memory_full_info()
            row["now_bytes"] = {"uss": int(info.uss), "pss": int(info.pss), "rss": int(info.rss)}
            row["peak_bytes"] = dict(self.sampler.peak)
            if trim_heap():  # what of that is free heap memory glibc kept (returned to the OS now)
                info = psutil.Process().memory_full_info()
                row["trimmed_bytes"] = {"uss": int(info.uss), "pss": int(info.pss), "rss": int(info.rss)}
        if trainer.global_rank == 0:
            row["metrics"] = {k: float(v) for k, v in trainer.callback_metrics.items()
                              if k.startswith(("comm/", "memory/", "time/", "train_loss"))}
        self.epochs.append(row)

    def on_fit_end(self, trainer, pl_module):
        (self.run_dir / f"epochs_rank{trainer.global_rank}.json").write_text(
            json.dumps({"epochs": self.epochs, "bandwidth_Bps": self.bandwidth}))

    def teardown(self, trainer, pl_module, stage):
        if self.sampler is not None:
            self.sampler.stop()


def trim_heap() -> bool:
    """Return free heap memory to the OS (glibc ``malloc_trim(0)``); ``False`` where there is no glibc."""
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0) or True)
    except (OSError, AttributeError):
        return False


def measure_bandwidth(trainer) -> float:
    """Point-to-point bandwidth between ranks 0 and 1 (bytes/s), measured with the package planner's function."""
    return float(planner_bandwidth(device=trainer.strategy.root_device))


def timed_epochs(epochs: List[float]) -> List[float]:
    """The epochs after the first (warm-up), or all of them with only one."""
    return epochs[1:] or epochs


def run_plain(spec: dict, data: Data, csr: bool) -> dict:
    """The plain PyTorch loop (``pyg_edge_index`` or ``pyg_csr``), one full-graph Adam step per epoch."""
    threads = spec.get("threads_single", THREADS_SINGLE)
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model = build_model(spec, normalize=not csr)
    if csr:
        graph = csr_adjacency(data.edge_index, data.num_nodes, spec["model"])
        del data.edge_index  # the best baseline keeps only adj_t
    else:
        graph = data.edge_index
    setup_s = time.perf_counter() - t0
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y, mask = data.x, data.y, data.train_mask
    seconds, losses = [], []
    model.train()
    for _ in range(spec["epochs"]):
        start = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(x, graph)[mask], y[mask])
        loss.backward()
        opt.step()
        seconds.append(time.perf_counter() - start)
        losses.append(float(loss))
    return {"epoch_s_all": seconds, "losses": losses, "mode_setup_s": setup_s, "threads": threads}


def run_trainer(spec: dict, data: Data, run_dir: Path) -> dict:
    """A Lightning fit: ``trainer_single`` (1 process) or a 2-process strategy mode."""
    mode = spec["mode"]
    devices, chunks = (2, TWO_PROCESS[mode]) if mode in TWO_PROCESS else (1, 1)
    single = spec.get("threads_single", THREADS_SINGLE)
    threads = THREADS_RANK if devices > 1 else single
    torch.set_num_threads(single)  # the partitioning below runs alone
    t0 = time.perf_counter()
    dm = GraphChunkDataModule(data, num_chunks=chunks)
    strategy = STRATEGIES.get(mode)
    setup_s = time.perf_counter() - t0
    options = spec.get("strategy_kwargs") or {}  # e.g. {"heap_mmap_threshold": null}: glibc's own heap setting
    trainer = Trainer(accelerator="cpu", devices=devices, strategy=strategy(**options) if strategy else "auto",
                      max_epochs=spec["epochs"], logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      limit_val_batches=0, callbacks=[Probe(str(run_dir), threads)])
    module = (GNNModule if mode == "gnnpipe_default" else ScaleModule)(build_model(spec))
    trainer.fit(module, datamodule=dm)
    ranks = [json.loads((run_dir / f"epochs_rank{r}.json").read_text()) for r in range(devices)]
    per_epoch = [max(r["epochs"][e]["epoch_s"] for r in ranks) for e in range(len(ranks[0]["epochs"]))]
    metrics = [e.get("metrics", {}) for e in ranks[0]["epochs"]]
    out = {"epoch_s_all": per_epoch, "epoch_s_ranks": [[e["epoch_s"] for e in r["epochs"]] for r in ranks],
           "losses": [m.get("train_loss") for m in metrics], "mode_setup_s": setup_s, "threads": threads,
           "chunks": chunks, "processes": devices, "bandwidth_Bps": ranks[0].get("bandwidth_Bps")}
    if devices > 1:
        out.update(comm_summary(metrics))
        out["breakdown"] = [{k: r["epochs"][-1][k] for k in ("kept_bytes", "now_bytes", "peak_bytes", "trimmed_bytes")
                             if k in r["epochs"][-1]} for r in ranks]
    return out


def comm_summary(metrics: List[dict]) -> dict:
    """Bytes sent per epoch by all ranks (median over the timed epochs) and the last epoch's comm metrics.

    Uses ``comm/sent_total`` if the strategy logs it, else the sum of the ``comm/sent/<kind>`` keys.
    """
    def total(m: dict) -> float:
        if "comm/sent_total" in m:
            return m["comm/sent_total"]
        return sum(v for k, v in m.items() if k.startswith("comm/sent/"))

    timed = timed_epochs(metrics)
    last = metrics[-1]
    return {"bytes_sent_per_epoch": int(statistics.median(total(m) for m in timed)),
            "bytes_sent_by_kind": {k[len("comm/sent/"):]: int(v) for k, v in last.items()
                                   if k.startswith("comm/sent/")},
            "comm_last_epoch": {k: v for k, v in last.items() if k.startswith(("comm/", "memory/", "time/"))}}


def versions() -> dict:
    """Versions of torch, PyG, Lightning and Python."""
    import lightning
    import torch_geometric

    return {"torch": torch.__version__, "torch_geometric": torch_geometric.__version__,
            "lightning": lightning.__version__, "python": sys.version.split()[0]}


def selfcheck(nodes: int = 2000, tol: float = 1e-5) -> List[str]:
    """Check that the ``pyg_csr`` path computes what the ``pyg_edge_index`` path computes.

    For GCN and SAGE (3 layers), on an undirected SBM graph and on a directed subgraph of it, the outputs and the
    parameter gradients of ``model(x, adj_t)`` must equal those of ``model(x, edge_index)`` within ``tol``.

    Returns:
        One line per check.

    Raises:
        AssertionError: If a difference exceeds ``tol``.
    """
    lines = []
    base = sbm(nodes, num_blocks=8, avg_degree=10, num_features=16, num_classes=4)
    for name, edge_index in (("undirected", base.edge_index), ("directed", base.edge_index[:, ::2])):
        for model in ("gcn", "sage"):
            spec = {"model": model, "features": 16, "hidden": 16, "layers": 3, "classes": 4, "seed": 0}
            ref, csr = build_model(spec), build_model(spec, normalize=False)
            csr.load_state_dict(ref.state_dict())
            out_ref = ref(base.x, edge_index)
            out_csr = csr(base.x, csr_adjacency(edge_index, nodes, model))
            out_ref.square().mean().backward()
            out_csr.square().mean().backward()
            diff = float((out_ref - out_csr).abs().max())
            grad = max(float((a.grad - b.grad).abs().max()) for a, b in zip(ref.parameters(), csr.parameters()))
            lines.append(f"selfcheck {model} {name}: max |out diff| {diff:.2e}, max |grad diff| {grad:.2e} "
                         f"(tolerance {tol:g})")
            assert diff <= tol and grad <= tol, lines[-1]
    return lines


def main(spec: dict, run_dir: Path) -> None:
    """Measure one run and write ``result.json``; the process's memory goes to ``mem_main.json``."""
    sampler = MemorySampler(run_dir / "mem_main.json").start()
    if spec["mode"] == "planner":
        from benchmarks.scale.planner import planner_estimates

        result = planner_estimates(spec, graph_from_spec)
    else:
        torch.set_num_threads(spec.get("threads_single", THREADS_SINGLE))
        t0 = time.perf_counter()
        data = graph_from_spec(spec)
        graph_s, edges = time.perf_counter() - t0, int(data.num_edges)
        if spec["mode"] in ("pyg_edge_index", "pyg_csr"):
            result = run_plain(spec, data, csr=spec["mode"] == "pyg_csr")
        elif spec["mode"] == "trainer_single" or spec["mode"] in TWO_PROCESS:
            result = run_trainer(spec, data, run_dir)
        else:
            raise ValueError(f"scale_worker: unknown mode {spec['mode']!r}.")
        timed = timed_epochs(result["epoch_s_all"])
        result.update(graph_s=graph_s, edges=edges, epoch_s=statistics.median(timed),
                      timed_epochs=len(timed))
    sampler.stop()
    result["versions"] = versions()
    (run_dir / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), Path(sys.argv[2]))
