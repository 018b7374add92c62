"""``WholeGraphStrategy``: the Lightning plumbing shared by the pipeline and the graph-parallel strategy.

Both strategies train one full-graph step per epoch with the graph cut across processes and the user's unchanged
``training_step`` run on the full-graph output. What they share lives here, shaped like Lightning's own
``ModelParallelStrategy`` (Lightning 2.6): the launcher (spawn or popen; torchrun and SLURM start the processes
themselves), the process group, ranks, ``barrier``/``broadcast``/``reduce``, moving the model and optimizers, the
precision plugin, gradients handed from the strategy's own backward to Lightning's ``optimizer.step``, the exact
evaluation steps, failure notes and the checkpoint glue. A subclass builds its model runtime (:meth:`_build`),
runs a training step and computes the exact full-graph logits (:meth:`full_logits`).
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from datetime import timedelta
from typing import Any, Dict, List, Literal, Optional, Tuple, Union

import torch
import torch.distributed as dist
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor
from torch.optim import Optimizer
from torchmetrics import Metric

from lightning_gnnpipe._compat import (LauncherHook, default_process_group_backend, init_dist_connection,
                                       optimizers_to_device, sync_ddp_if_available)
from lightning_gnnpipe.comm.accounting import CommStats, StepClock, log_comm
from lightning_gnnpipe.data.datamodule import GraphChunkDataModule
from lightning_gnnpipe.nn.stack import LayerStack, infer_dims
from lightning_gnnpipe.strategy.failures import NCCL_ERROR_HANDLING, enable_nccl_error_handling, handle_rank_failure
from lightning_gnnpipe.strategy.forward_patch import stack_returns
from lightning_gnnpipe.strategy.insight import PipelineInsight
from lightning_gnnpipe.strategy.allocator import (DEFAULT_HEAP_MMAP_THRESHOLD, check_heap_mmap_threshold,
                                                  rank_allocator_settings, release_shared_pages, started_by_strategy,
                                                  trim_heap, warn_unset_settings)
from lightning_gnnpipe.strategy.partition_loading import PartitionLoading, release_partition_edges
from lightning_gnnpipe.strategy.launcher import (CheckedMultiProcessingLauncher, HugePageScriptLauncher,
                                                destroy_groups_at_exit)
from lightning_gnnpipe.strategy.precision import autocast_dtype, check_precision
from lightning_gnnpipe.strategy.process_state import quiet_sync_dist_advice


def distributed_is_initialized() -> bool:
    """Whether this process is a rank of an initialised default process group."""
    return dist.is_available() and dist.is_initialized()


class WholeGraphStrategy(LauncherHook, PartitionLoading, ParallelStrategy):
    """Base of :class:`~lightning_gnnpipe.GNNPipeStrategy` and :class:`~lightning_gnnpipe.GraphParallelStrategy`.

    Args:
        timeout: Timeout of every collective (default 600 s); a rank that stops answering ends the job after this
            long at most.
        exchange_timeout: Timeout of the strategy's own exchanges during steps and evaluation (stage transfers, halo
            rows, gradient sums, logits, metrics; default 120 s, at most ``timeout``): they run in process groups of
            their own, so a rank that died or hangs ends the job after this long. Under NCCL that is the watchdog's
            timeout; :func:`~lightning_gnnpipe.strategy.failures.enable_nccl_error_handling` is applied in every
            rank. Raise it if a stage's work between two transfers (an exact forward over the whole graph) can take
            longer. Lightning's own collectives and checkpoint writes keep ``timeout``.
        start_method: ``"spawn"`` (default) or ``"popen"``; under torchrun/SLURM the processes already exist.
        process_group_backend: ``"gloo"`` (CPU default) or ``"nccl"`` (GPU default).
        profile_epoch: Record this epoch's training step with ``torch.profiler`` (one Chrome trace per rank).
        trace_dir: Directory of those traces (default: ``traces/`` in the run directory); only with ``profile_epoch``.
        accelerator, parallel_devices, cluster_environment, checkpoint_io, precision_plugin: Set by the
            ``Trainer``, as for Lightning's ``DDPStrategy``; leave them out.
        heap_mmap_threshold: Bytes (default 16 MiB): on Linux with glibc, the ranks this strategy starts (spawn: all;
            popen: all but rank 0) give CPU blocks of this size and more their own memory mapping, returned to the OS
            when freed, instead of glibc's dynamic threshold (:mod:`~lightning_gnnpipe.strategy.allocator`, with the
            measured effect), for the rest of their life. A process it did not start (rank 0 under popen, ranks
            started by torchrun or SLURM) is left as it is, with a warning: set ``MALLOC_MMAP_THRESHOLD_`` in the
            environment that starts it instead. ``None`` leaves the C allocator as it is.
        huge_pages: Start the ranks this strategy starts (spawn: all; popen: all but rank 0, the launching process)
            with torch's transparent huge pages for CPU tensors of 2 MiB and more (``THP_MEM_ALLOC_ENABLE=1``, unless
            the environment sets it already), so that a page fault maps 2 MiB, not 4 KiB. Default ``True``. Under
            torchrun/SLURM set ``THP_MEM_ALLOC_ENABLE=1`` in the job's environment instead.

    Raises:
        ValueError: Unknown ``start_method``, bad ``profile_epoch`` or ``heap_mmap_threshold``, ``trace_dir`` without
            ``profile_epoch``, ``huge_pages`` not a bool, ``exchange_timeout`` not a positive ``timedelta``.
    """

    graph_on_host = ("edge_index",)
    """Attributes of the graph that the batch keeps on the CPU (:meth:`GraphChunkDataModule.device_graph
    <lightning_gnnpipe.data.datamodule.GraphChunkDataModule.device_graph>`): the stages aggregate over their own chunk
    graphs; the batch's ``edge_index`` is only what ``self(x, edge_index)`` passes on."""

    def __init__(
        self,
        timeout: timedelta = timedelta(seconds=600),
        exchange_timeout: timedelta = timedelta(seconds=120),
        start_method: Literal["spawn", "popen"] = "spawn",
        process_group_backend: Optional[str] = None,
        profile_epoch: Optional[int] = None,
        trace_dir: Optional[str] = None,
        accelerator=None,
        parallel_devices: Optional[List[torch.device]] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision_plugin: Optional[Precision] = None,
        heap_mmap_threshold: Optional[int] = DEFAULT_HEAP_MMAP_THRESHOLD,
        huge_pages: bool = True,
    ) -> None:
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment, checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin)
        if start_method not in ("spawn", "popen"):
            raise ValueError(f"{type(self).__name__}: `start_method` must be 'spawn' or 'popen' (got {start_method!r}).")
        self._timeout, self._start_method = timeout, start_method
        if not isinstance(exchange_timeout, timedelta) or exchange_timeout <= timedelta(0):
            raise ValueError(f"{type(self).__name__}: `exchange_timeout` must be a positive timedelta (got "
                             f"{exchange_timeout!r}). Use e.g. timedelta(seconds=120).")
        self._exchange_timeout = min(timeout, exchange_timeout)
        self.exchange_group: Any = None  # every rank, with `exchange_timeout` (setup_environment)
        self._heap_mmap_threshold = check_heap_mmap_threshold(heap_mmap_threshold, type(self).__name__)
        if not isinstance(huge_pages, bool):
            raise ValueError(f"{type(self).__name__}: `huge_pages` must be True or False (got {huge_pages!r}).")
        self.huge_pages = huge_pages
        self._process_group_backend = process_group_backend
        self._num_nodes = 1
        self.insight = PipelineInsight(profile_epoch, trace_dir)  # epoch time, memory, bubble, traces
        self._stack: Optional[LayerStack] = None
        self._dims: List[int] = []  # feature width entering each block and leaving the last (set at setup)
        self._boundary_dtype: Optional[torch.dtype] = None  # dtype between stages (set at setup)
        self._num_nodes_graph = 0  # |V| of the graph being trained (set at setup)
        self._grads: List[tuple] = []
        self.comm_stats = CommStats()  # this rank's traffic in the last training step
        self.comm_metrics: Dict[str, float] = {}  # every rank's, as logged (comm/...)
        self._rank_group: Any = None  # this rank alone: where torchmetrics sync
        self.released_graph_bytes = 0  # bytes of shared graph pages this rank let go of at setup
        self._changes = ExitStack()  # this fit's changes to its process, undone at teardown (strategy/process_state.py)

    # ------------------------------------------------------------------ ranks and devices (as DDP)
    @property
    def root_device(self) -> torch.device:
        assert self.parallel_devices is not None
        return self.parallel_devices[self.local_rank]

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        self._num_nodes = num_nodes

    @property
    def num_processes(self) -> int:
        return len(self.parallel_devices) if self.parallel_devices is not None else 0

    @property
    def is_distributed(self) -> bool:
        return True

    @property
    def distributed_sampler_kwargs(self) -> Dict[str, Any]:
        """One data-parallel replica: Lightning's ``DistributedSampler`` gives every rank the whole graph."""
        return {"num_replicas": 1, "rank": 0}

    @property
    def process_group_backend(self) -> Optional[str]:
        return self._process_group_backend

    def make_launcher(self) -> Any:
        assert self.cluster_environment is not None
        if self._start_method == "popen" or self.cluster_environment.creates_processes_externally:
            # popen, or torchrun/SLURM already started the processes (then this launcher is a no-op)
            return HugePageScriptLauncher(self.cluster_environment, self.num_processes, self.num_nodes,
                                          huge_pages=self.huge_pages)
        return CheckedMultiProcessingLauncher(self, start_method=self._start_method)

    def setup_environment(self) -> None:
        # Validate before the process group exists (also under torchrun, where no launcher runs).
        self.check(self.lightning_module.trainer)
        check_precision(self.precision_plugin, type(self).__name__)
        # Every rank logs the single-device values (one data-parallel replica, `reduce` below): Lightning's advice to
        # log epoch metrics with sync_dist=True changes nothing here.
        self._changes.callback(quiet_sync_dist_advice())
        super().setup_environment()
        self.set_world_ranks()
        on_cpu = self.root_device.type == "cpu"  # before the graph is built; on rank 0: the process that lacks them
        warn_unset_settings(type(self).__name__, self.global_rank,  # one line, from rank 0
                            rank_allocator_settings(self._heap_mmap_threshold, self.huge_pages and on_cpu))
        self._process_group_backend = self._process_group_backend or default_process_group_backend(self.root_device)
        assert self.cluster_environment is not None
        if enable_nccl_error_handling(self._process_group_backend):  # before the NCCL process group exists
            self._changes.callback(os.environ.pop, NCCL_ERROR_HANDLING, None)
        init_dist_connection(self.cluster_environment, self._process_group_backend, timeout=self._timeout)
        if started_by_strategy():  # a rank process of ours: its groups go before the interpreter does
            destroy_groups_at_exit()
        self.exchange_group = dist.new_group(timeout=self._exchange_timeout, group_desc="gnnpipe_exchange")
        self._setup_groups()

    def _setup_groups(self) -> None:
        """Create the strategy's sub-groups (a collective, right after the default group exists)."""

    def set_world_ranks(self) -> None:
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
            self.cluster_environment.set_world_size(self.num_nodes * self.num_processes)
        rank_zero_only.rank = self.global_rank

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        if distributed_is_initialized():
            device_ids = [self.root_device.index] if dist.get_backend() == "nccl" else None
            dist.barrier(device_ids=device_ids)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not distributed_is_initialized():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src, device=self.root_device if dist.get_backend() == "nccl" else None)
        return box[0]

    # Every rank runs the user's steps on the same whole-graph output and batch: to Lightning the job is one
    # data-parallel replica. What a rank logs, reduces or gathers is already the single-device value, so these
    # need no communication (and may not communicate: on the last stage the user's ``training_step`` runs inside
    # the pipeline schedule, where the other ranks are not at the same collective).
    def reduce(self, tensor: Any, group: Optional[Any] = None, reduce_op: Optional[Union[str, Any]] = "mean") -> Any:
        """Return ``tensor`` unchanged: the reduction over one data-parallel replica (``self.log(sync_dist=True)``)."""
        return tensor

    def all_gather(self, tensor: Tensor, group: Optional[Any] = None, sync_grads: bool = False) -> Tensor:
        """Return ``tensor`` unchanged, as on one device (``LightningModule.all_gather`` over one replica)."""
        return tensor

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """Combine a callback's decision over every rank (a collective; callbacks run on every rank at once)."""
        if not distributed_is_initialized():
            return decision
        votes = torch.tensor(int(decision), device=self.root_device)
        votes = sync_ddp_if_available(votes, None, reduce_op="sum")
        return bool(votes == self.world_size) if all else bool(votes)

    def _local_metrics(self) -> None:
        """Sync every torchmetrics metric of the module over this rank alone (a collective: creates the groups).

        Each rank updates its metrics with the same whole-graph values; a world-wide sync would count every node
        once per rank (a ``SumMetric`` of labelled nodes would read ``world_size`` times the truth).
        """
        if self._rank_group is None:
            self._rank_group, _ = dist.new_subgroups_by_enumeration([[r] for r in range(self.world_size)],
                                                                    timeout=self._timeout)
        for metric in self.lightning_module.modules():
            if isinstance(metric, Metric):
                self._changes.callback(setattr, metric, "process_group", metric.process_group)  # its own at teardown
                metric.process_group = self._rank_group

    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    # ------------------------------------------------------------------ setup
    def check(self, trainer: Trainer, module: Optional[LightningModule] = None, datamodule: Any = None) -> LayerStack:
        """Validate model, DataModule and layout before any process group starts; return the layer stack."""
        raise NotImplementedError

    def setup(self, trainer: Trainer) -> None:
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        assert self.model is not None
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self._local_metrics()
        self.comm_stats.clock = StepClock(self.root_device)  # CUDA events on a GPU
        self._build(trainer)
        # What the ranks read the whole graph for is built: let go of the shared pages they no longer read
        self.released_graph_bytes = release_shared_pages(self._graph_tensors_done(trainer.datamodule.data))
        release_partition_edges(self, trainer.datamodule)  # a loaded partition's edge list, where nothing reads it
        trim_heap()  # and of the heap the build freed
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
            if self.insight not in trainer.callbacks:
                trainer.callbacks.append(self.insight)
        self.precision_plugin = self._training_precision(self.precision_plugin)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            optimizers_to_device(self.optimizers, self.root_device)

    def host_threads(self) -> Optional[int]:
        """Intra-op threads of all of this machine's ranks together, at most its usable cores (``None`` on a GPU).

        What a rank may use while the others on its machine wait for it (the stages of the exact forward).
        """
        if self.root_device.type != "cpu":
            return None
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return max(1, min(cores, torch.get_num_threads() * self.num_processes))

    def _graph_tensors_done(self, data: Any) -> List[Tensor]:
        """The graph's tensors this rank no longer reads once :meth:`_build` ran (its pages are released when shared
        memory, :func:`~lightning_gnnpipe.strategy.allocator.release_shared_pages`): the edge list."""
        return [data.edge_index]

    def _training_precision(self, plugin: Precision) -> Precision:
        """The precision plugin to train with (a subclass may swap in global-norm clipping)."""
        return plugin

    def _build(self, trainer: Trainer) -> None:
        raise NotImplementedError

    def _prepare(self, trainer: Trainer) -> tuple:
        """Check the layout and that all ranks hold one plan; return ``(stack, plan, data, x)``."""
        dm: GraphChunkDataModule = trainer.datamodule
        stack = self._stack = self.check(trainer)
        prints: List[Any] = [None] * self.world_size
        dist.all_gather_object(prints, dm.plan.fingerprint())
        if len(set(prints)) != 1:
            raise RuntimeError(
                f"{type(self).__name__}: ranks built different chunk plans (got fingerprints {prints}). "
                "Build the GraphChunkDataModule from the same graph on every rank, or pass `part=`."
            )
        x = dm.device_graph(self.root_device, self.graph_on_host).x  # the copy every step's batch holds
        self._dims = infer_dims(stack.blocks, x[:2])
        # Stage activations travel in the autocast dtype, if any (strategy/precision.py).
        self._boundary_dtype = autocast_dtype(self.precision_plugin) or x.dtype
        self._num_nodes_graph = dm.plan.num_nodes
        return stack, dm.plan, dm.data, x

    # ------------------------------------------------------------------ steps
    def _begin_step(self) -> None:
        for p in self.lightning_module.parameters():
            p.grad = None

    def kept_bytes(self) -> Tuple[int, int]:
        """Bytes this rank keeps for the whole fit, ``(history tables, chunk graphs)`` (0, 0 before setup); each
        strategy says what it holds."""
        raise NotImplementedError

    def _log_comm(self) -> Dict[str, float]:
        """Log this step's traffic of every rank as ``comm/...`` and return it (a collective)."""
        return log_comm(self.lightning_module, self.comm_stats, self.exchange_group)

    def _end_step(self, output: Any) -> Any:
        """Stash the step's gradients for :meth:`backward`; return the output detached."""
        self._grads = [(p, p.grad) for p in self.lightning_module.parameters() if p.grad is not None]
        return apply_to_collection(output, Tensor, lambda t: t.detach())

    def backward(self, closure_loss: Tensor, optimizer: Optional[Optimizer], *args: Any, **kwargs: Any) -> Tensor:
        """Do not backpropagate again: restore the gradients the training step computed.

        Lightning zeroes gradients between ``training_step`` and ``backward``; the strategy's
        gradients were stashed after the step ran and come back here, so they reach
        ``optimizer.step`` and never leak into the next epoch. The ``on_before_backward`` and
        ``on_after_backward`` hooks still run.
        """
        lm = self.lightning_module
        closure_loss = self.precision_plugin.pre_backward(closure_loss, lm)
        for p, g in self._grads:
            p.grad = g
        self._grads = []
        return self.precision_plugin.post_backward(closure_loss, lm)

    def full_logits(self) -> Tensor:
        """The exact full-graph output ``(|V|, C)`` of the current weights, on every rank (a collective)."""
        raise NotImplementedError

    def _eval_step(self, hook: str, *args: Any, **kwargs: Any) -> Any:
        assert self._stack is not None
        logits = self.full_logits()
        with torch.no_grad(), stack_returns(self._stack.module, logits, args[0]):
            return getattr(self.lightning_module, hook)(*args, **kwargs)

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.val_step_context():
            return self._eval_step("validation_step", *args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.test_step_context():
            return self._eval_step("test_step", *args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.predict_step_context():
            return self._eval_step("predict_step", *args, **kwargs)

    # ------------------------------------------------------------------ checkpoints and failures
    def optimizer_state(self, optimizer: Optimizer) -> Dict[str, Any]:
        """Return the optimizer's ``state_dict`` (every rank holds the same one here)."""
        opt = optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer  # a LightningOptimizer
        return opt.state_dict()

    def on_exception(self, exception: BaseException) -> None:
        """Name the rank in the error; see :mod:`~lightning_gnnpipe.strategy.failures`."""
        if distributed_is_initialized():  # in a rank, not in the main process of a spawn launch
            handle_rank_failure(exception, self.rank_location())

    def rank_location(self) -> str:
        """This rank's place, named in error notes."""
        return f"rank {self.global_rank}"

    def teardown(self) -> None:
        self._changes.close()  # what this fit changed in its process (strategy/process_state.py)
        self._grads, self._rank_group, self.exchange_group = [], None, None
        super().teardown()
