"""``GNNPipeStrategy``: pipelined layer-level model parallelism for full-graph GNN training.

Source: GNNPipe, arXiv 2308.10087. Lightning plumbing: :class:`~lightning_gnnpipe.strategy.base.WholeGraphStrategy`;
stages and schedule: :class:`~lightning_gnnpipe.pipeline.runtime.PipelineRuntime` (``torch.distributed.pipelining``);
history refreshes: :class:`~lightning_gnnpipe.history.lifecycle.HistoryLifecycle`; layout: ``strategy/topology.py``.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import Tensor

from lightning_gnnpipe.history.lifecycle import HistoryLifecycle
from lightning_gnnpipe.nn.stack import LayerStack
from lightning_gnnpipe.pipeline.balance import check_balance, stage_layers
from lightning_gnnpipe.pipeline.schedule import AUTO
from lightning_gnnpipe.pipeline.runtime import PipelineRuntime, RankLayout, check_stage_widths
from lightning_gnnpipe.strategy.base import WholeGraphStrategy
from lightning_gnnpipe.strategy.checkpoint import PipelineCheckpointHooks, restore_tables
from lightning_gnnpipe.strategy.checks import (check_layout, check_lightning_usage, check_pipeline_options,
                                              resolve_halo_gradients, resolve_refresh_every)
from lightning_gnnpipe.strategy.failures import unwrap_stage_error
from lightning_gnnpipe.strategy.forward_patch import stack_returns
from lightning_gnnpipe.strategy.graph_parallel_eval import GraphParallelEvaluation, exact_forward
from lightning_gnnpipe.strategy.precision import global_norm_clipping
from lightning_gnnpipe.strategy.schedule_choice import ScheduleChoice, choose_schedule, probe_on_one_rank
from lightning_gnnpipe.strategy.state import tensor_owners
from lightning_gnnpipe.strategy.topology import PipelineTopology, build_mesh
from lightning_gnnpipe.strategy.user_loss import UserLoss, has_chunk_loss


class GNNPipeStrategy(PipelineCheckpointHooks, WholeGraphStrategy):
    """Train a GNN with its layers cut into pipeline stages, one stage per process (or several).

    The ``L`` layer blocks of the model (found automatically in a PyG ``BasicGNN``, or declared with
    ``pipeline_blocks()``) are cut into ``S = devices`` stages of consecutive layers. The graph, cut into ``K``
    chunks by :class:`~lightning_gnnpipe.GraphChunkDataModule`, flows through the stages chunk by chunk under a
    ``torch.distributed.pipelining`` schedule. Each stage keeps a history table per layer; a chunk reads its halo
    rows fresh if the halo's chunk already passed that layer in this epoch, historical otherwise (GNNPipe, arXiv
    2308.10087, Sec. 4). One optimizer step per epoch, gradients accumulated over all chunks, loss normalised over
    the whole graph; or ``K / c`` steps of ``c`` chunks each (``GraphChunkDataModule(chunks_per_step=c)``). Training
    runs the user's unchanged ``training_step`` on the full-graph output (broadcast from the last stage, so every rank
    logs the same values). Validation, test and predict run an exact forward: the full-graph metrics.

    Args:
        schedule: ``"auto"`` (default): ``"1f1b"`` when the ``training_step`` loss is a sum of per-node terms (checked
            once at setup, see :mod:`~lightning_gnnpipe.strategy.schedule_choice`) or the module defines
            ``pipeline_chunk_loss``, and ``K / G >= S``; else ``"gpipe"``, with one line saying why. ``"gpipe"``
            (exact for any loss; keeps every chunk's activations until the backward) or ``"1f1b"`` (at most about
            ``S`` chunks'; same step); with ``stages_per_rank >= 2``: ``"interleaved_1f1b"``, ``"looped_bfs"``,
            ``"interleaved_zb"`` or ``"zbv"`` (same loss rule as 1F1B; see ``docs/choosing.md``).
        stages_per_rank: ``v``, virtual stages per process. The ``L`` layers are cut into ``S * v``
            stages; virtual stage ``i`` runs on rank ``i % S`` (loop placement), or for ``"zbv"`` (``v = 2``)
            rank ``r`` runs stages ``r`` and ``2S - 1 - r`` (V shape). Default 1 (one stage per process).
        refresh_on_start: Fill the history tables with an exact forward at the start of fit (and of a resumed fit),
            not zeros; a resumed fit whose checkpoint holds the tables loads them instead (no refresh).
        refresh_every: Also refresh every this many epochs (0: never): one no-grad exact forward (that of the fit's
            validation just before it, in full precision); ``log_staleness`` logs ``gnnpipe/refresh_seconds``.
            ``"auto"`` (default): 1 where the fit validates every epoch, so that the validation is each refresh, else
            0 (:func:`~lightning_gnnpipe.strategy.checks.resolve_refresh_every`).
        history_momentum: Moving-average momentum ``m`` of the tables: a write stores ``m * old + (1 - m) * new``.
        history_dtype: Dtype of the history tables (default ``None``: torch's, float32); ``torch.bfloat16`` or
            ``"bfloat16"`` halves their bytes, and halo rows are then read rounded (docs/results/notes/memory.md).
        halo_gradients: ``"detach"`` drops the gradients that reach halo rows, ``"stale"`` applies them to the owner
            one epoch later (PipeGCN), ``"fresh"`` in the same epoch (odd epochs run the chunks in reverse); ``"auto"``
            (default): ``"fresh"`` where exact, else ``"detach"`` (``strategy/checks.py::resolve_halo_gradients``).
        log_staleness: Log per epoch ``gnnpipe/stale_edge_fraction`` (edges read historical, per layer >= 1),
            ``gnnpipe/stale_age_epochs`` (their mean age) and, at each periodic refresh, ``gnnpipe/drift_layer{l}``
            (``||h_hist - h_exact|| / ||h_exact||``).
        balance: How layers are cut into stages: ``"count"`` (default; equal numbers of layers) or ``"time"`` (equal
            measured forward+backward time, profiled once on one chunk on rank 0; ``pipeline/balance.py``).
        save_history: Also store every history table in checkpoints (``|V| x d_l`` floats per layer), so that a
            resumed run continues exactly like an uninterrupted one. See ``docs/reliability.md``.
        graph_parallel_size: ``G``, graph partitions for hybrid parallelism. The ``devices * num_nodes`` processes
            form ``S = devices * num_nodes / G`` stages x ``G`` partitions: rank ``g * S + s`` runs stage ``s`` of
            partition ``g``'s pipeline, and the ``G`` ranks of a stage exchange halo rows and sum weight gradients
            (:mod:`~lightning_gnnpipe.comm.partitions`; the rank mesh: :mod:`~lightning_gnnpipe.strategy.topology`).
            The DataModule must be cut with ``num_parts=G``. Default 1 (pure pipeline parallelism). ``G`` = number
            of processes and one chunk per partition is exact graph parallelism.
        activation_checkpointing: Recompute each layer block's forward during its backward
            (``torch.utils.checkpoint``, dropout draws reproduced), keeping only each block's input rows (inner and
            halo). Same results, one more forward; less memory for blocks with large intermediates (edge-list
            convs), more for PyG layers on the sparse path (docs/results/scale.md). GPipe keeps every chunk's
            activations until the backward; 1F1B at most about ``S`` chunks' (the schedule that keeps least).
        evaluation: The exact forward of evaluation and refreshes: ``"graph_parallel"`` (``"auto"`` when ``G = 1``,
            ``K >= S``, no ``bf16-mixed``, at most 2x the bytes): all ranks at once, halo rows exchanged per layer
            (``strategy/graph_parallel_eval.py``); ``"pipeline"``: stage after stage, ``|V| x d`` each.
        **kwargs: ``timeout``, ``exchange_timeout``, ``start_method``, ``process_group_backend``, ``profile_epoch``,
            ``trace_dir``, ``heap_mmap_threshold``, ``huge_pages``: see :class:`~lightning_gnnpipe.strategy.base.WholeGraphStrategy`.

    Raises:
        ValueError: Unknown ``schedule``, ``balance`` or ``start_method``, bad ``profile_epoch``, a ``stages_per_rank``
            the schedule does not take, a ``history_dtype`` that is no float dtype, a multi-stage schedule with
            ``halo_gradients`` ``"stale"``/``"fresh"`` or ``graph_parallel_size > 1`` (here); bad layouts or a precision
            other than ``"32-true"`` / ``"bf16-mixed"`` before the process group starts (see ``check_layout``,
            ``check_precision``); at setup, a named schedule other than ``"gpipe"`` whose loss is neither separable
            nor given by ``pipeline_chunk_loss``; on resume, a checkpoint whose history tables do not fit the model.
        TypeError: No ``GraphChunkDataModule`` or no splittable layer stack, before the process group starts.
        RuntimeError: The ranks built different chunk plans or stage widths (at setup); a ``training_step``
            whose loss does not depend on the model's output, or that calls the layer stack with other or
            more inputs than the batch's ``x`` and ``edge_index`` (at the first step).
    """

    strategy_name = "gnnpipe"

    def __init__(
        self,
        schedule: str = AUTO,
        refresh_on_start: bool = True,
        refresh_every: Union[int, str] = "auto",
        history_momentum: float = 0.0,
        history_dtype: Any = None,
        halo_gradients: str = "auto",
        log_staleness: bool = True,
        balance: str = "count",
        save_history: bool = False,
        graph_parallel_size: int = 1,
        stages_per_rank: int = 1,
        activation_checkpointing: bool = False,
        evaluation: str = "auto",
        **kwargs: Any,
    ) -> None:
        self.schedule_name, self.history_dtype, self.evaluation = check_pipeline_options(
            schedule, stages_per_rank, refresh_every, history_momentum, halo_gradients, graph_parallel_size,
            history_dtype, evaluation)
        super().__init__(**kwargs)
        self.stages_per_rank, self.graph_parallel_size = stages_per_rank, graph_parallel_size
        self.refresh_on_start, self.refresh_every, self.save_history = refresh_on_start, refresh_every, save_history
        self.history_momentum, self.halo_gradients = history_momentum, halo_gradients
        self.log_staleness, self.balance = log_staleness, check_balance(balance)
        self.activation_checkpointing = bool(activation_checkpointing)
        self.device_mesh: Any = None  # (G, S) mesh ("partition", "stage"); 1-D ("stage",) when G = 1
        self._pp_group: Any = None  # this rank's pipeline (S ranks); None = world
        self._gp_group: Any = None  # this rank's stage group (G ranks); None without hybrid
        self._runtime: Optional[PipelineRuntime] = None
        self._evaluation: Any = None  # the graph-parallel evaluation: its builder until the first evaluation
        self._history: Optional[HistoryLifecycle] = None
        self._resume_state: Optional[Dict[str, Any]] = None
        self._owners: Dict[int, int] = {}
        self._layers: List[List[int]] = []  # layers of every rank of the pipeline (S lists)
        self.schedule_choice: Optional[ScheduleChoice] = None  # what this fit runs (set at setup)
        self._loss: Optional[UserLoss] = None  # the user's loss, handed to the runtime each step

    # ------------------------------------------------------------------ layout
    @property
    def topology(self) -> PipelineTopology:
        """The rank layout: ``S`` stages x ``G`` partitions, ``v`` stages per rank."""
        return PipelineTopology(self.num_nodes * self.num_processes, self.graph_parallel_size,
                                self.stages_per_rank, self.schedule_name)

    @property
    def num_stages(self) -> int:
        """``S``: processes / ``graph_parallel_size`` (one stage per process, ``G`` pipelines)."""
        return self.topology.num_stages

    @property
    def stage_index(self) -> int:
        """``s``: this rank's stage in its pipeline."""
        return self.topology.stage_index(self.global_rank)

    @property
    def partition_index(self) -> int:
        """``g``: this rank's graph partition (its pipeline), 0 without hybrid parallelism."""
        return self.topology.partition_index(self.global_rank)

    def _setup_groups(self) -> None:
        self.device_mesh, self._pp_group, self._gp_group = build_mesh(self.topology, self.root_device.type,
                                                                      self._exchange_timeout, self.exchange_group)

    def check(self, trainer: Trainer, module: Optional[LightningModule] = None, datamodule: Any = None) -> LayerStack:
        """Validate model, DataModule and layout before any process group starts; return the layer stack.

        Raises:
            TypeError, ValueError: As :func:`~lightning_gnnpipe.strategy.checks.check_layout`.
        """
        module = module if module is not None else trainer.lightning_module
        stack = check_layout(module, datamodule if datamodule is not None else trainer.datamodule, self.num_stages,
                             self.schedule_name, fitting=trainer.state.fn in (None, TrainerFn.FITTING),
                             graph_parallel_size=self.graph_parallel_size, stages_per_rank=self.stages_per_rank,
                             world_size=self.num_nodes * self.num_processes, evaluation=self.evaluation,
                             halo_gradients=self.halo_gradients)
        check_lightning_usage(trainer, module, stack, "GNNPipeStrategy")
        return stack

    # ------------------------------------------------------------------ building the pipeline
    def _build(self, trainer: Trainer) -> None:
        (stack, plan, data, x), dm = self._prepare(trainer), trainer.datamodule
        topo, rank = self.topology, self.global_rank
        virtual = stage_layers(self.balance, stack.blocks, topo.num_virtual_stages, plan, data.edge_index, x)
        ranks = topo.virtual_stage_ranks  # stage i runs on pipeline position ranks[i]
        self._layers = [[layer for i, r in enumerate(ranks) if r == s for layer in virtual[i]]
                        for s in range(topo.num_stages)]
        self._owners = tensor_owners(stack.blocks, self._layers)
        rank_zero_info(topo.describe(virtual, plan.chunk_sizes, plan.edge_cut))
        layout = RankLayout(topo.local_stages(rank), ranks, self.stage_index,
                            [topo.rank_of(rank, s) for s in range(topo.num_stages)], self._pp_group,
                            self._gp_group, self.graph_parallel_size, self.partition_index)
        autocast = (self._boundary_dtype or x.dtype) != x.dtype
        every = resolve_refresh_every(self.refresh_every, trainer, self.lightning_module, autocast)
        halo_grads = self.broadcast(resolve_halo_gradients(self.halo_gradients, every, self.schedule_name,  # rank 0's
            self.graph_parallel_size, stack.blocks, trainer.state.fn == TrainerFn.FITTING, dm.steps_per_epoch))
        runtime = self._runtime = PipelineRuntime(
            stack.blocks, virtual, self._dims, plan, data.edge_index, x, layout, self.root_device, self.comm_stats,
            self.history_momentum, halo_grads, self._boundary_dtype, self.activation_checkpointing,
            self.history_dtype, self.host_threads())
        self._evaluation = None if self.graph_parallel_size > 1 else partial(GraphParallelEvaluation.build,  # G = 1
            self.evaluation, self.graph_parallel_size, stack.blocks, plan, data.edge_index, x, topo.num_stages,
            self.stage_index, self._pp_group, self.root_device, runtime.boundary_dtype != x.dtype, self._dims, virtual)
        check_stage_widths(runtime.widths, self._pp_group)
        self._history = HistoryLifecycle(runtime.stages, self._exact_forward, every, self.log_staleness,
                                         runtime.stale_stats(dm), autocast)
        if trainer.state.fn == TrainerFn.FITTING:
            self._loss = UserLoss(self.lightning_module, stack.module, runtime.stages[-1].graph.nodes)
            self._loss.check_steps(dm, self.batch_to_device, self._dims[-1], x.dtype, self.root_device)
            batch = self.batch_to_device(dm.data)
            probe = probe_on_one_rank(lambda: self._loss.probe(batch, self._dims[-1], x.dtype, self.root_device),
                                      topo.virtual_stage_ranks[-1], rank, self.broadcast)
            choice = self.schedule_choice = choose_schedule(
                self.schedule_name, dm.chunks_per_step // self.graph_parallel_size, self.num_stages,
                has_chunk_loss(self.lightning_module), probe)
            if choice.reason is not None:
                rank_zero_info(f"GNNPipeStrategy: schedule 'gpipe', not '1f1b': {choice.reason}.")
            self._loss.loss_mode = choice.loss_mode
            runtime.build_schedule(choice.schedule, choice.loss_mode, dm.chunks_per_step)

    def _graph_tensors_done(self, data: Any) -> List[Tensor]:  # stage 0 reads the features (and a stage making x0)
        first = self._runtime is not None and any(stage.x is not None for stage in self._runtime.stages)
        return super()._graph_tensors_done(data) + ([] if first or not isinstance(data.x, Tensor) else [data.x])

    def _training_precision(self, plugin: Precision) -> Precision:
        # A rank holds only its stage's gradients: clip by the norm over all stages (strategy/precision.py).
        return global_norm_clipping(plugin, group=self._pp_group, device=self.root_device)

    def refresh_history(self) -> Dict[int, float]:
        """Refill every history table with an exact forward (a collective); return every stage's drift per layer."""
        return self._history.refresh()  # type: ignore[union-attr]

    def on_train_start(self) -> None:
        super().on_train_start()
        saved, self._resume_state = self._resume_state, None
        restored = restore_tables(saved, self._runtime.stages if self._runtime is not None else [],  # same everywhere
                                  self.lightning_module.trainer.datamodule.plan, self.partition_index)
        if not restored and self.refresh_on_start:
            self.refresh_history()

    # ------------------------------------------------------------------ steps
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        assert self._runtime is not None and self._history is not None and self._stack is not None and self._loss
        lm, batch = self.lightning_module, args[0]
        self._begin_step()
        self._history.before_epoch(lm.trainer.current_epoch, lambda name, value: lm.log(name, value, batch_size=1,
            on_step=False, on_epoch=True, sync_dist=True), lm.trainer.global_step)  # the same on every rank
        chunks = getattr(batch, "chunk_ids", None)  # several steps an epoch: this step's chunks (data/steps.py)
        with self.precision_plugin.train_step_context():
            try:
                logits, output = self._runtime.step(*self._loss.for_step(batch, args, kwargs), chunks=chunks)
            except RuntimeError as exc:
                original = unwrap_stage_error(exc)
                if original is exc:
                    raise
                raise original from None  # the block's own error, with its traceback
            self.comm_metrics = self._log_comm()
            if output is None:
                with torch.no_grad(), stack_returns(self._stack.module, logits, batch):
                    output = lm.training_step(*args, **kwargs)
        return self._end_step(output)

    def full_logits(self) -> Tensor:
        if self._history.refreshes_in_evaluation(self.lightning_module.trainer):  # one forward: evaluation, refresh
            return self._history.refresh_in_evaluation(self.lightning_module.trainer)
        return self._exact_forward()

    def _exact_forward(self, **kwargs: Any) -> Tensor:  # write_history, drift: graph_parallel_eval.exact_forward
        split = self._evaluation = self._evaluation() if isinstance(self._evaluation, partial) else self._evaluation
        return exact_forward(split, self._runtime, self.lightning_module, self._owners, self._layers, **kwargs)

    def kept_bytes(self) -> Tuple[int, int]:  # (history tables, chunk graphs) of this rank's stages, in bytes
        tables, graphs = self._runtime.kept_bytes() if self._runtime is not None else (0, 0)
        return tables, graphs + getattr(self._evaluation, "nbytes", lambda: 0)()  # once the evaluation is built

    def rank_location(self) -> str:
        """This rank's place, named in error notes: ``"rank r (stage s of S[, partition g of G][, layers [...]])"``."""
        return self.topology.location(self.global_rank, self._layers)

    def teardown(self) -> None:
        self._runtime = self._history = self._resume_state = self.schedule_choice = self._loss = self._evaluation = None
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(cls.strategy_name, cls, description="GNNPipe pipelined GNN training (spawn)")
        strategy_registry.register("gnnpipe_popen", cls, description="GNNPipe pipelined GNN training (popen)",
                                   start_method="popen")
