"""``GNNPipeStrategy``: pipelined layer-level model parallelism for full-graph GNN training.

Source: GNNPipe, arXiv 2308.10087. Lightning plumbing (launcher, process group, ranks)
follows ``lightning.pytorch.strategies.DDPStrategy`` (Lightning 2.6); stages and schedules are
``torch.distributed.pipelining`` (torch 2.13).
"""

from __future__ import annotations

import logging
import time
import warnings
from datetime import timedelta
from typing import Any, Dict, List, Literal, Mapping, Optional, Union

import torch
import torch.distributed as dist
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.utilities.distributed import _distributed_is_initialized, _init_dist_connection
from lightning.fabric.utilities.distributed import _get_default_process_group_backend_for_device
from lightning.fabric.utilities.distributed import _sync_ddp_if_available
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_only
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor
from torch.optim import Optimizer

from lightning_gnnpipe.comm.accounting import CommStats, log_comm
from lightning_gnnpipe.comm.gradients import all_reduce_grads
from lightning_gnnpipe.comm.pipeline import PipelineRecorder
from lightning_gnnpipe.comm.slot_exchange import StageExchange, build_slot_plans
from lightning_gnnpipe.data.datamodule import GraphChunkDataModule
from lightning_gnnpipe.nn.stack import LayerStack, infer_dims, takes_x0
from lightning_gnnpipe.pipeline.balance import check_balance, stage_layers
from lightning_gnnpipe.pipeline.graph import build_chunk_graph
from lightning_gnnpipe.pipeline.loss import PipelineLoss, chunk_has_labels
from lightning_gnnpipe.pipeline.schedule import build_schedule, check_schedule, is_multi_stage, stage_ranks
from lightning_gnnpipe.pipeline.stage import GNNStage
from lightning_gnnpipe.strategy.checkpoint import CHECKPOINT_KEY, gather_pipeline_state, restore_history, restore_rng
from lightning_gnnpipe.strategy.checks import CHUNK_LOSS_HOOK, check_layout, check_stage_widths
from lightning_gnnpipe.strategy.failures import handle_rank_failure, unwrap_stage_error
from lightning_gnnpipe.strategy.forward_patch import stack_returns
from lightning_gnnpipe.strategy.insight import PipelineInsight
from lightning_gnnpipe.strategy.launcher import _CheckedMultiProcessingLauncher
from lightning_gnnpipe.strategy.precision import BoundaryCast, autocast_dtype, check_precision, global_norm_clipping
from lightning_gnnpipe.strategy.state import broadcast_blocks, merged_optimizer_state, sync_stage_tensors, tensor_owners

log = logging.getLogger(__name__)


def _not_last_stage(*_: Any) -> Tensor:
    raise RuntimeError("GNNPipeStrategy: the loss ran on a stage that is not the last one.")


class GNNPipeStrategy(ParallelStrategy):
    """Train a GNN with its layers cut into pipeline stages, one stage per process (or several).

    The ``L`` layer blocks of the model (found automatically in a PyG ``BasicGNN``, or
    declared with ``pipeline_blocks()``) are cut into ``S = devices`` stages of consecutive
    layers. The graph, cut into ``K`` chunks by :class:`~lightning_gnnpipe.GraphChunkDataModule`,
    flows through the stages chunk by chunk under a ``torch.distributed.pipelining`` schedule.
    Each stage keeps a history table per layer; a chunk reads its halo rows fresh if the halo's
    chunk already passed that layer in this epoch, historical otherwise (GNNPipe,
    arXiv 2308.10087, Sec. 4). One optimizer step per epoch, gradients accumulated over all
    chunks, loss normalised over the whole graph.

    Training runs the user's unchanged ``training_step`` on the full-graph output (assembled
    on the last stage and broadcast to every rank, so every rank logs the same values).
    Validation, test and predict run an exact layer-by-layer forward through the stages (no
    historical rows), so their metrics are the model's true full-graph metrics.

    Args:
        schedule: ``"gpipe"`` (default; exact for any ``training_step`` loss) or ``"1f1b"``
            (needs ``pipeline_chunk_loss`` on the module, see ``docs/quickstart.md``); with
            ``stages_per_rank >= 2``: ``"interleaved_1f1b"``, ``"looped_bfs"``, ``"interleaved_zb"`` or
            ``"zbv"`` (also need ``pipeline_chunk_loss``; see ``docs/choosing.md``).
        stages_per_rank: ``v``, virtual stages per process. The ``L`` layers are cut into ``S * v``
            stages; virtual stage ``i`` runs on rank ``i % S`` (loop placement), or for ``"zbv"`` (``v = 2``)
            rank ``r`` runs stages ``r`` and ``2S - 1 - r`` (V shape). Default 1 (one stage per process).
        refresh_on_start: Fill the history tables with an exact forward at the start of fit (and
            of a resumed fit), instead of starting from zeros. On resume from a checkpoint that
            holds the tables, they are loaded instead (no refresh).
        refresh_every: Also refresh every this many epochs (0: never). Each refresh costs one
            no-grad full-graph forward; with ``log_staleness=True`` (the default) its time is logged as
            ``gnnpipe/refresh_seconds``.
        history_momentum: Moving-average momentum ``m`` of the history tables: a write stores
            ``m * old + (1 - m) * new`` (0: plain overwrite).
        halo_gradients: ``"detach"`` (default) drops gradients that reach halo rows;
            ``"stale"`` applies them to the owner chunk one epoch later (PipeGCN-style).
        log_staleness: Log per epoch ``gnnpipe/stale_edge_fraction`` (edges read historical, per
            layer >= 1), ``gnnpipe/stale_age_epochs`` (their mean age) and, at each periodic refresh,
            ``gnnpipe/drift_layer{l}`` (``||h_hist - h_exact|| / ||h_exact||``).
        balance: How layers are cut into stages: ``"count"`` (default; equal numbers of
            layers) or ``"time"`` (equal measured forward+backward time, profiled once on one
            chunk on rank 0; see :mod:`lightning_gnnpipe.pipeline.balance`).
        save_history: Also store every history table in checkpoints (``|V| x d_l`` floats per
            layer), so that a resumed run continues exactly like an uninterrupted one. See
            ``docs/reliability.md``.
        profile_epoch: Record this epoch's training step with ``torch.profiler`` and write one
            Chrome trace per rank (see :class:`~lightning_gnnpipe.strategy.insight.PipelineInsight`).
        trace_dir: Directory of those traces (default: ``traces/`` in the run directory).
        timeout: Timeout of every collective (seconds as ``timedelta``); a rank that stops
            answering ends the job after this long. Default 600 s.
        start_method: ``"spawn"`` (default) or ``"popen"``; under torchrun/SLURM the processes
            already exist and this is ignored.
        process_group_backend: ``"gloo"`` (CPU default) or ``"nccl"`` (GPU default).
        graph_parallel_size: ``G``, graph partitions for hybrid parallelism. The ``devices * num_nodes``
            processes form ``S = devices * num_nodes / G`` stages x ``G`` partitions: rank ``g * S + s`` runs
            stage ``s`` of partition ``g``'s pipeline, and the ``G`` ranks of a stage exchange halo rows and
            sum weight gradients (:mod:`~lightning_gnnpipe.comm.slot_exchange`). The DataModule must be cut
            with ``num_parts=G``. Default 1 (pure pipeline parallelism). ``G`` = number of processes and one
            chunk per partition is exact graph parallelism.
        accelerator: Lightning's, set by the ``Trainer`` (as for ``DDPStrategy``); leave it out.
        parallel_devices: Set by the ``Trainer`` from ``devices``; leave it out.
        cluster_environment: Set by the ``Trainer`` (torchrun, SLURM, ...); leave it out.
        checkpoint_io: Lightning's checkpoint I/O plugin (default: the ``Trainer``'s).
        precision_plugin: Set by the ``Trainer`` from ``precision``; leave it out.

    Raises:
        ValueError: Unknown ``schedule``, ``balance`` or ``start_method``, bad ``profile_epoch``, a
            ``stages_per_rank`` the schedule does not take, a multi-stage schedule with
            ``halo_gradients="stale"`` or ``graph_parallel_size > 1`` (here); bad
            layouts or a precision other than ``"32-true"`` / ``"bf16-mixed"`` before the process group
            starts (see :func:`~lightning_gnnpipe.strategy.checks.check_layout` and
            :func:`~lightning_gnnpipe.strategy.precision.check_precision`); on resume, a checkpoint whose
            history tables do not fit the model.
        TypeError: No ``GraphChunkDataModule`` or no splittable layer stack, before the process group starts.
        RuntimeError: The ranks built different chunk plans or stage widths (at setup); a ``training_step``
            whose loss does not depend on the model's output, or that calls the layer stack with other or
            more inputs than the batch's ``x`` and ``edge_index`` (at the first step).
    """

    strategy_name = "gnnpipe"
    _sharded_gradients = True  # each rank holds only its stage's gradients

    def __init__(
        self,
        schedule: str = "gpipe",
        refresh_on_start: bool = True,
        refresh_every: int = 0,
        history_momentum: float = 0.0,
        halo_gradients: str = "detach",
        log_staleness: bool = True,
        balance: str = "count",
        save_history: bool = False,
        profile_epoch: Optional[int] = None,
        trace_dir: Optional[str] = None,
        timeout: timedelta = timedelta(seconds=600),
        start_method: Literal["spawn", "popen"] = "spawn",
        process_group_backend: Optional[str] = None,
        graph_parallel_size: int = 1,
        stages_per_rank: int = 1,
        accelerator=None,
        parallel_devices: Optional[List[torch.device]] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision_plugin: Optional[Precision] = None,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        self.schedule_name = check_schedule(schedule, stages_per_rank=stages_per_rank)
        self.stages_per_rank = stages_per_rank
        if start_method not in ("spawn", "popen"):
            raise ValueError(f"GNNPipeStrategy: `start_method` must be 'spawn' or 'popen' (got {start_method!r}).")
        self.refresh_on_start = refresh_on_start
        self.save_history = save_history
        self._resume_state: Optional[Dict[str, Any]] = None
        if isinstance(refresh_every, bool) or not isinstance(refresh_every, int) or refresh_every < 0:
            raise ValueError(f"GNNPipeStrategy: `refresh_every` must be an int >= 0 epochs (got {refresh_every!r}).")
        if not 0.0 <= history_momentum < 1.0:
            raise ValueError(f"GNNPipeStrategy: `history_momentum` must be in [0, 1) (got {history_momentum}).")
        if halo_gradients not in ("detach", "stale"):
            raise ValueError(
                f"GNNPipeStrategy: `halo_gradients` must be 'detach' or 'stale' (got {halo_gradients!r})."
            )
        if isinstance(graph_parallel_size, bool) or not isinstance(graph_parallel_size, int) or graph_parallel_size < 1:
            raise ValueError(
                f"GNNPipeStrategy: `graph_parallel_size` must be an int >= 1 (got {graph_parallel_size!r})."
            )
        if graph_parallel_size > 1 and halo_gradients != "detach":
            raise ValueError(
                "GNNPipeStrategy: `halo_gradients='stale'` is not supported with `graph_parallel_size` > 1 "
                f"(got graph_parallel_size={graph_parallel_size}). Use halo_gradients='detach'."
            )
        if is_multi_stage(self.schedule_name) and halo_gradients != "detach":
            raise ValueError(
                f"GNNPipeStrategy: `halo_gradients='stale'` is not supported with the multi-stage schedule "
                f"{self.schedule_name!r} (got halo_gradients={halo_gradients!r}). Use halo_gradients='detach', or "
                "schedule 'gpipe'/'1f1b'."
            )
        if is_multi_stage(self.schedule_name) and graph_parallel_size > 1:
            raise ValueError(
                f"GNNPipeStrategy: the multi-stage schedule {self.schedule_name!r} is not supported with hybrid "
                f"parallelism (got graph_parallel_size={graph_parallel_size}). Use graph_parallel_size=1, or "
                "schedule 'gpipe'/'1f1b'."
            )
        self.graph_parallel_size = graph_parallel_size
        self._pp_group: Any = None  # this rank's pipeline (S ranks); None = world
        self._gp_group: Any = None  # this rank's stage group (G ranks); None without hybrid
        self.refresh_every = refresh_every
        self.history_momentum = history_momentum
        self.halo_gradients = halo_gradients
        self.log_staleness = log_staleness
        self.balance = check_balance(balance)
        self.insight = PipelineInsight(profile_epoch, trace_dir)  # epoch time, memory, bubble, traces
        self._timeout = timeout
        self._start_method = start_method
        self._process_group_backend = process_group_backend
        self._num_nodes = 1
        self._stack: Optional[LayerStack] = None
        self._stages: List[GNNStage] = []  # this rank's stages, in pipeline order
        self._stage_ids: List[int] = []  # their (virtual) stage indices
        self._stage_rank: List[int] = []  # rank (position in the pipeline) of every stage
        self._schedule = None
        self._loss: Optional[PipelineLoss] = None
        self._grads: List[tuple] = []
        self._owners: Dict[int, int] = {}
        self._layers: List[List[int]] = []  # layers of every rank of the pipeline (S lists)
        self.comm_stats = CommStats()  # this rank's traffic in the last training step
        self.comm_metrics: Dict[str, float] = {}  # every rank's, as logged (comm/...)

    # ------------------------------------------------------------------ plumbing (as DDP)
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
        # Deliberately False: every rank must get the same full-graph batch, so Lightning must
        # not inject a DistributedSampler.
        return False

    @property
    def num_stages(self) -> int:
        """``S``: processes / ``graph_parallel_size`` (one stage per process, ``G`` pipelines)."""
        return self.num_nodes * self.num_processes // self.graph_parallel_size

    @property
    def stage_index(self) -> int:
        """``s``: this rank's stage in its pipeline."""
        return self.global_rank % self.num_stages

    @property
    def partition_index(self) -> int:
        """``g``: this rank's graph partition (its pipeline), 0 without hybrid parallelism."""
        return self.global_rank // self.num_stages

    def _rank_of(self, stage: int) -> int:
        """Global rank of stage ``stage`` in this rank's pipeline."""
        return self.partition_index * self.num_stages + stage

    @property
    def num_virtual_stages(self) -> int:
        """``S * v``: stages of the pipeline (``v = stages_per_rank`` per process)."""
        return self.num_stages * self.stages_per_rank

    @property
    def last_stage_rank(self) -> int:
        """``s`` of the rank running the pipeline's last stage (``S - 1``; 0 under ``"zbv"``)."""
        return stage_ranks(self.schedule_name, self.num_stages, self.stages_per_rank)[-1]

    @property
    def is_last_stage(self) -> bool:
        """Whether this rank runs the pipeline's last stage (it computes the loss)."""
        return self.stage_index == self.last_stage_rank

    @property
    def process_group_backend(self) -> Optional[str]:
        return self._process_group_backend

    def _configure_launcher(self) -> None:
        assert self.cluster_environment is not None
        if self._start_method == "popen" or self.cluster_environment.creates_processes_externally:
            # popen, or torchrun/SLURM already started the processes (then this launcher is a no-op)
            self._launcher = _SubprocessScriptLauncher(self.cluster_environment, self.num_processes, self.num_nodes)
        else:
            self._launcher = _CheckedMultiProcessingLauncher(self, start_method=self._start_method)

    def setup_environment(self) -> None:
        # Validate before the process group exists (also under torchrun, where no launcher runs).
        self.check(self.lightning_module.trainer)
        check_precision(self.precision_plugin, type(self).__name__)
        # Every rank logs identical values (the full-graph output is broadcast), so Lightning's advice
        # to add `sync_dist=True` to epoch-level logs does not apply here.
        warnings.filterwarnings("ignore", message=r".*when logging on epoch level in distributed setting.*")
        super().setup_environment()
        self._setup_distributed()

    def _setup_distributed(self) -> None:
        self.set_world_ranks()
        self._process_group_backend = self._process_group_backend or _get_default_process_group_backend_for_device(
            self.root_device
        )
        assert self.cluster_environment is not None
        _init_dist_connection(self.cluster_environment, self._process_group_backend, timeout=self._timeout)
        self._pp_group = self._gp_group = None
        G, S = self.graph_parallel_size, self.num_stages
        if G > 1:  # a 2-D mesh of ranks g * S + s: one group per pipeline, one per stage (all ranks create all)
            for g in range(G):
                group = dist.new_group([g * S + s for s in range(S)], timeout=self._timeout)
                self._pp_group = group if g == self.partition_index else self._pp_group
            for s in range(S):
                group = dist.new_group([g * S + s for g in range(G)], timeout=self._timeout)
                self._gp_group = group if s == self.stage_index else self._gp_group

    def set_world_ranks(self) -> None:
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
            self.cluster_environment.set_world_size(self.num_nodes * self.num_processes)
        rank_zero_only.rank = self.global_rank

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        if _distributed_is_initialized():
            dist.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not _distributed_is_initialized():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src)
        return box[0]

    def reduce(self, tensor: Any, group: Optional[Any] = None, reduce_op: Optional[Union[str, Any]] = "mean") -> Any:
        if isinstance(tensor, Tensor):
            return _sync_ddp_if_available(tensor, group, reduce_op=reduce_op)
        return tensor

    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    # ------------------------------------------------------------------ building the pipeline
    def check(self, trainer: Trainer, module: Optional[LightningModule] = None, datamodule: Any = None) -> LayerStack:
        """Validate model, DataModule and layout; raise before any process group starts.

        Args:
            trainer: The ``Trainer``.
            module: The LightningModule (default: the trainer's).
            datamodule: The DataModule (default: the trainer's).

        Returns:
            The model's layer stack.

        Raises:
            TypeError: No ``GraphChunkDataModule`` or no splittable layer stack.
            ValueError: A process count that is not a multiple of ``graph_parallel_size``, a DataModule
                with ``num_parts`` other than it, or a bad layout
                (:func:`~lightning_gnnpipe.strategy.checks.check_layout`).
        """
        module = module if module is not None else trainer.lightning_module
        datamodule = datamodule if datamodule is not None else trainer.datamodule
        fitting = trainer.state.fn in (None, TrainerFn.FITTING)
        G, world = self.graph_parallel_size, self.num_nodes * self.num_processes
        if world % G:
            raise ValueError(
                f"GNNPipeStrategy: the {world} processes cannot form `graph_parallel_size`={G} pipelines "
                f"(got devices * num_nodes = {world}). Use a process count that is a multiple of {G}."
            )
        parts = getattr(datamodule, "num_parts", 1)
        if isinstance(datamodule, GraphChunkDataModule) and parts != G:
            raise ValueError(
                f"GNNPipeStrategy: `graph_parallel_size`={G} needs the graph cut into {G} partitions, but the "
                f"DataModule has num_parts={parts}. Build it as GraphChunkDataModule(data, num_chunks=K, "
                f"num_parts={G})."
            )
        return check_layout(module, datamodule, self.num_stages, self.schedule_name, fitting=fitting,
                            graph_parallel_size=G, stages_per_rank=self.stages_per_rank)

    def setup(self, trainer: Trainer) -> None:
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        assert self.model is not None
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self._build(trainer)
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
            if self.insight not in trainer.callbacks:
                trainer.callbacks.append(self.insight)
        if self._sharded_gradients:  # clip by the norm over all stages (strategy/precision.py)
            self.precision_plugin = global_norm_clipping(self.precision_plugin, group=self._pp_group,
                                                         device=self.root_device)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)

    def _prepare(self, trainer: Trainer) -> tuple:
        """Check the layout and that all ranks hold one plan; return ``(stack, plan, data, x)``."""
        dm: GraphChunkDataModule = trainer.datamodule
        stack = self._stack = self.check(trainer)
        self._check_same_plan(dm.plan)
        x = dm.data.x.to(self.root_device)
        self._dims = infer_dims(stack.blocks, x[:2])
        # Stage activations travel in the autocast dtype, if any (strategy/precision.py).
        self._data_dtype, self._boundary_dtype = x.dtype, autocast_dtype(self.precision_plugin) or x.dtype
        return stack, dm.plan, dm.data, x

    def _build(self, trainer: Trainer) -> None:
        stack, plan, data, x = self._prepare(trainer)
        device = self.root_device
        # Layers of every (virtual) stage, S * v contiguous runs; stage i runs on rank ranks[i].
        virtual = stage_layers(self.balance, stack.blocks, self.num_virtual_stages, plan, data.edge_index, x)
        ranks = stage_ranks(self.schedule_name, self.num_stages, self.stages_per_rank)
        self._stage_ids = [i for i, r in enumerate(ranks) if r == self.stage_index]
        layers = self._layers = [[layer for i, r in enumerate(ranks) if r == s for layer in virtual[i]]
                                 for s in range(self.num_stages)]
        self._stage_rank = ranks
        self._owners = tensor_owners(stack.blocks, layers)
        rank_zero_info(f"GNNPipeStrategy: stage -> layers {virtual}" + (
            f", rank -> stages {[[i for i, r in enumerate(ranks) if r == s] for s in range(self.num_stages)]}"
            if self.stages_per_rank > 1 else "") + f"; {plan.num_chunks} chunks of "
            f"{min(plan.chunk_sizes)}-{plan.max_chunk_size} nodes, edge cut {plan.edge_cut:.3f}")
        G, g = self.graph_parallel_size, self.partition_index
        self._chunk_ids = list(range(g, plan.num_chunks, G))  # this pipeline's micro-batches, in order
        carry_x0 = any(takes_x0(b) for b in stack.blocks)
        self._stages = []
        for i in self._stage_ids:
            blocks = [stack.blocks[layer] for layer in virtual[i]]
            graph = build_chunk_graph(plan, data.edge_index, blocks, device, dtype=x.dtype)
            exchange = None
            if G > 1:  # one stage per rank (multi-stage schedules are refused with G > 1)
                plans = [p.to(device) if p is not None else None for p in build_slot_plans(plan, G, g)]
                exchange = StageExchange(plans, self._gp_group, self.comm_stats)
                broadcast_blocks(blocks, src=self.stage_index, group=self._gp_group)  # every pipeline: same weights
            self._stages.append(GNNStage(blocks, virtual[i], self._dims, graph, x=x if 0 in virtual[i] else None,
                                         history_momentum=self.history_momentum, halo_gradients=self.halo_gradients,
                                         carry_x0=carry_x0, exchange=exchange))
        check_stage_widths({i: (st.input_widths, st.output_widths) for i, st in zip(self._stage_ids, self._stages)},
                           self._pp_group)
        self._stale_stats = trainer.datamodule.stale_read_stats()
        self._num_nodes_graph = plan.num_nodes
        self._x_pad = None
        if 0 in self._stage_ids:
            m = plan.max_chunk_size
            self._x_pad = plan.pad(data.x).view(plan.num_chunks, m, -1)[self._chunk_ids].reshape(
                len(self._chunk_ids) * m, -1).to(device)
        self._num_chunks = len(self._chunk_ids)
        self._schedule = None
        if trainer.state.fn == TrainerFn.FITTING:
            mode = "deferred" if self.schedule_name == "gpipe" else "chunk"
            gather = self._gather_logits if G > 1 else None
            last = self.num_virtual_stages - 1
            self._loss = PipelineLoss(self._stages[-1].graph, plan.num_nodes, mode, chunks=self._chunk_ids,
                                      gather=gather) if last in self._stage_ids else None
            modules, in_dtypes, out_dtypes = [], [], []
            for i, stage in zip(self._stage_ids, self._stages):
                in_dtypes.append(self._data_dtype if i == 0 else self._boundary_dtype)
                out_dtypes.append(self._data_dtype if i == last else self._boundary_dtype)
                modules.append(stage if self._boundary_dtype == self._data_dtype else
                               BoundaryCast(stage, self._data_dtype, out_dtypes[-1]))
            self._schedule = build_schedule(
                modules, self._stage_ids, self.num_virtual_stages, device, plan.max_chunk_size,
                [st.input_widths for st in self._stages], [st.output_widths for st in self._stages],
                self.schedule_name, len(self._chunk_ids),
                # Every rank must pass a loss_fn: the schedules run backwards only when one is set.
                self._loss if self._loss is not None else _not_last_stage,
                group=self._pp_group, in_dtypes=in_dtypes, out_dtypes=out_dtypes,
            )
            self._recorder = PipelineRecorder(self._schedule, self.comm_stats)

    def _check_same_plan(self, plan: Any) -> None:
        prints: List[Any] = [None] * self.world_size
        dist.all_gather_object(prints, plan.fingerprint())
        if len(set(prints)) != 1:
            raise RuntimeError(
                f"{type(self).__name__}: ranks built different chunk plans (got fingerprints {prints}). "
                "Build the GraphChunkDataModule from the same graph on every rank, or pass `part=`."
            )

    # ------------------------------------------------------------------ exact full-graph forward
    def _send_recv_full(self, h: Optional[Tensor], write_history: bool,
                        drift: Optional[Dict[int, float]] = None) -> Tensor:
        """Exact layer-by-layer forward through all stages; return logits ``(|V|, C)`` on every rank.

        The stages run in pipeline order; an output goes by send/recv only when the next stage lives
        on another rank (several stages per rank), else it is passed on in place.
        """
        assert self._stages
        n, me, ranks = self._num_nodes_graph, self.stage_index, self._stage_rank
        device = self.root_device
        outputs: tuple = ()
        for i, stage in zip(self._stage_ids, self._stages):
            if i == 0:
                inputs = [stage.x]
            elif ranks[i - 1] == me:  # the previous stage ran here: its outputs (as sent) are the inputs
                inputs = [t.to(self._boundary_dtype).to(self._data_dtype) for t in outputs]
            else:
                inputs = [torch.empty(n, d, device=device, dtype=self._boundary_dtype) for d in stage.input_widths]
                for t in inputs:
                    dist.recv(t, src=self._rank_of(ranks[i - 1]))
                inputs = [t.to(self._data_dtype) for t in inputs]
            out = stage.forward_full(*inputs, write_history=write_history, drift=drift)
            outputs = out if isinstance(out, tuple) else (out,)
            if i == len(ranks) - 1:
                h = outputs[0].to(self._data_dtype)
            elif ranks[i + 1] != me:
                for t in outputs:
                    dist.send(t.to(self._boundary_dtype).contiguous(), dst=self._rank_of(ranks[i + 1]))
        if not self.is_last_stage:
            h = torch.empty(n, self._dims[-1], device=device, dtype=self._data_dtype)
        dist.broadcast(h, src=self._rank_of(self.last_stage_rank), group=self._pp_group)
        return h

    def _gather_logits(self, partial: Tensor) -> Tensor:
        """Hybrid: sum the last stages' logits ``(|V|, C)`` (each nonzero on its partition only)."""
        with self.comm_stats.waiting():
            dist.all_reduce(partial, group=self._gp_group)
        self.comm_stats.record_all_reduce("logits", partial, self.graph_parallel_size)
        return partial

    def refresh_history(self) -> Dict[int, float]:
        """Refill every stage's history tables with an exact no-grad full-graph forward.

        Returns:
            Drift ``||h_hist - h_exact|| / ||h_exact||`` per refreshed layer, gathered from all stages.
        """
        assert self._stages
        flags = [(m, m.training) for stage in self._stages for m in stage.modules()]
        for stage in self._stages:
            stage.eval()
        drift: Dict[int, float] = {}
        try:
            self._send_recv_full(None, write_history=True, drift=drift)
        finally:
            for m, flag in flags:
                m.training = flag
        gathered: List[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, drift)
        return {k: v for part in gathered for k, v in part.items()}

    def _before_step(self) -> None:
        """Periodic refresh, halo-gradient epoch switch and staleness logging, once per epoch."""
        assert self._stages
        lm = self.lightning_module
        epoch = lm.trainer.current_epoch
        log = dict(batch_size=1, on_step=False, on_epoch=True)
        if self.refresh_every and epoch > 0 and epoch % self.refresh_every == 0:
            start = time.perf_counter()
            drift = self.refresh_history()
            if self.log_staleness:
                lm.log("gnnpipe/refresh_seconds", time.perf_counter() - start, **log)
                for layer, value in sorted(drift.items()):
                    lm.log(f"gnnpipe/drift_layer{layer}", value, **log)
        for stage in self._stages:
            stage.next_epoch(epoch)
        if self.log_staleness:
            lm.log("gnnpipe/stale_edge_fraction", self._stale_stats[0], **log)
            lm.log("gnnpipe/stale_age_epochs", self._stale_stats[1], **log)

    def on_train_start(self) -> None:
        super().on_train_start()
        saved, self._resume_state = self._resume_state, None
        plan = self.lightning_module.trainer.datamodule.plan
        restored = bool(self._stages) and all([restore_history(saved, stage, plan) for stage in self._stages])
        if not restored and self.refresh_on_start:
            self.refresh_history()

    # ------------------------------------------------------------------ steps
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        assert self._schedule is not None and self._stack is not None
        lm = self.lightning_module
        batch = args[0]
        for p in lm.parameters():
            p.grad = None
        self._before_step()
        ids = torch.tensor(self._chunk_ids, device=self.root_device)
        step_args = (self._x_pad,) if self._x_pad is not None else ()
        step_kwargs: Dict[str, Any] = {"chunk_id": ids}
        if self.is_last_stage:
            assert self._loss is not None
            self._loss.reset(full_loss=lambda full: self._user_loss(full, batch, args, kwargs),
                             chunk_loss=lambda out, c: self._chunk_loss(out, c, batch))
            step_kwargs.update(target=ids, return_outputs=False)
        self._recorder.begin()
        with self.precision_plugin.train_step_context():
            try:
                self._schedule.step(*step_args, **step_kwargs)
            except RuntimeError as exc:
                original = unwrap_stage_error(exc)
                if original is exc:
                    raise
                raise original from None  # the block's own error, with its traceback
            if self.is_last_stage:
                logits = self._loss.logits()
            else:
                logits = torch.empty(self._num_nodes_graph, self._dims[-1], device=self.root_device,
                                     dtype=self._data_dtype)
            dist.broadcast(logits, src=self._rank_of(self.last_stage_rank), group=self._pp_group)
            if self.graph_parallel_size > 1:
                all_reduce_grads([p for st in self._stages for p in st.parameters()], self.comm_stats,
                                 self.graph_parallel_size, self._gp_group)
            self._recorder.end()
            self.comm_stats.record_broadcast("logits", logits, self.last_stage_rank, self.stage_index, self.num_stages)
            self.comm_metrics = log_comm(lm, self.comm_stats)
            if self.is_last_stage and self._loss.step_output is not None:
                output = self._loss.step_output
            else:
                with torch.no_grad(), stack_returns(self._stack.module, logits, batch):
                    output = lm.training_step(*args, **kwargs)
        self._grads = [(p, p.grad) for p in lm.parameters() if p.grad is not None]
        return apply_to_collection(output, Tensor, lambda t: t.detach())

    def _user_loss(self, full: Tensor, batch: Any, args: tuple, kwargs: dict):
        assert self._stack is not None
        with stack_returns(self._stack.module, full, batch):
            output = self.lightning_module.training_step(*args, **kwargs)
        loss = output["loss"] if isinstance(output, dict) else output
        return loss, output

    def _chunk_loss(self, out: Tensor, c: int, batch: Any) -> Tensor:
        assert self._stages
        nodes = self._stages[-1].graph.nodes[c]
        if not chunk_has_labels(batch, nodes):
            return out.sum() * 0.0  # the chunk still runs forward and backward, and adds exactly zero
        return getattr(self.lightning_module, CHUNK_LOSS_HOOK)(out, batch, nodes)

    def backward(self, closure_loss: Tensor, optimizer: Optional[Optimizer], *args: Any, **kwargs: Any) -> Tensor:
        """Do not backpropagate again: restore the gradients the schedule computed.

        Lightning zeroes gradients between ``training_step`` and ``backward``; the pipeline's
        gradients were stashed after the schedule ran and come back here, so they reach
        ``optimizer.step`` and never leak into the next epoch. The ``on_before_backward`` and
        ``on_after_backward`` hooks still run.
        """
        lm = self.lightning_module
        closure_loss = self.precision_plugin.pre_backward(closure_loss, lm)
        for p, g in self._grads:
            p.grad = g
        self._grads = []
        return self.precision_plugin.post_backward(closure_loss, lm)

    def _eval_step(self, hook: str, *args: Any, **kwargs: Any) -> Any:
        assert self._stack is not None
        logits = self._send_recv_full(None, write_history=False)
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

    # ------------------------------------------------------------------ checkpoints
    def lightning_module_state_dict(self) -> Dict[str, Any]:
        """Return the full model's ``state_dict`` (every stage's weights, original names)."""
        if _distributed_is_initialized() and self._owners:
            sync_stage_tensors(self.lightning_module, self._owners, group=self._pp_group)
        return self.lightning_module.state_dict()

    def optimizer_state(self, optimizer: Optimizer) -> Dict[str, Any]:
        """Return one single-device-shaped optimizer state, each parameter's from its owner."""
        opt = getattr(optimizer, "_optimizer", optimizer)
        if not _distributed_is_initialized() or not self._owners:
            return opt.state_dict()
        return merged_optimizer_state(opt, self._owners, self.stage_index, group=self._pp_group)

    def save_checkpoint(self, checkpoint: Dict[str, Any], filepath: Any, storage_options: Optional[Any] = None) -> None:
        """Add the pipeline's state (RNG, chunk plan, optional history tables) and write on rank 0.

        Called on every rank (the state is gathered to rank 0).
        """
        if self._stages and _distributed_is_initialized():
            state = gather_pipeline_state(self._stages, self.lightning_module.trainer.datamodule.plan, self._layers,
                                          self.stage_index, self.save_history and "optimizer_states" in checkpoint,
                                          group=self._pp_group)
            if state is not None:
                checkpoint[CHECKPOINT_KEY] = state
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: Optional[bool] = None) -> Dict[str, Any]:
        """Load the checkpoint on every rank and keep the pipeline's state for ``on_train_start``."""
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        self._resume_state = checkpoint.get(CHECKPOINT_KEY)
        return checkpoint

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Restore the optimizers, then this stage's random generators.

        Restoring the generators here, before the fit loop builds its first data iterator (which
        draws a seed), replays exactly the draws an uninterrupted run makes after the save.
        """
        super().load_optimizer_state_dict(checkpoint)
        restore_rng(checkpoint.get(CHECKPOINT_KEY), self.stage_index, self.num_stages)

    def on_exception(self, exception: BaseException) -> None:
        """Name the rank and stage in the error; see :mod:`~lightning_gnnpipe.strategy.failures`."""
        if _distributed_is_initialized():  # in a rank, not in the main process of a spawn launch
            handle_rank_failure(exception, self.rank_location())

    def rank_location(self) -> str:
        """This rank's place, named in error notes: ``"rank r (stage s of S[, partition g of G][, layers [...]])"``.

        ``s`` is the rank's stage in its pipeline, ``g`` its graph partition (hybrid parallelism only) and the
        layers those of its stages, once the model is split.
        """
        parts = [f"stage {self.stage_index} of {self.num_stages}"]
        if self.graph_parallel_size > 1:
            parts.append(f"partition {self.partition_index} of {self.graph_parallel_size}")
        if self._layers:
            parts.append(f"layers {self._layers[self.stage_index]}")
        return f"rank {self.global_rank} ({', '.join(parts)})"

    def on_train_end(self) -> None:
        super().on_train_end()
        # The model that spawn hands back to the main process is rank 0's: make it complete.
        if _distributed_is_initialized() and self._owners:
            sync_stage_tensors(self.lightning_module, self._owners, group=self._pp_group)

    def teardown(self) -> None:
        self._schedule = self._loss = self._resume_state = None
        self._stages, self._stage_ids = [], []
        self._grads = []
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(cls.strategy_name, cls, description="GNNPipe pipelined GNN training (spawn)")
        strategy_registry.register(
            "gnnpipe_popen", cls, description="GNNPipe pipelined GNN training (popen)", start_method="popen"
        )
