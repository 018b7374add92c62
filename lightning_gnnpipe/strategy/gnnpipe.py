"""``GNNPipeStrategy``: pipelined layer-level model parallelism for full-graph GNN training.

Source: GNNPipe, arXiv 2308.10087. Lightning plumbing (launcher, process group, ranks)
follows ``lightning.pytorch.strategies.DDPStrategy`` (Lightning 2.6); stages and schedules are
``torch.distributed.pipelining`` (torch 2.13).
"""

from __future__ import annotations

import logging
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

from lightning_gnnpipe.data.datamodule import GraphChunkDataModule
from lightning_gnnpipe.nn.stack import LayerStack, infer_dims
from lightning_gnnpipe.pipeline.graph import build_chunk_graph
from lightning_gnnpipe.pipeline.loss import PipelineLoss, chunk_has_labels
from lightning_gnnpipe.pipeline.schedule import build_schedule, check_schedule
from lightning_gnnpipe.pipeline.split import split_layers
from lightning_gnnpipe.pipeline.stage import GNNStage
from lightning_gnnpipe.strategy.checkpoint import CHECKPOINT_KEY, gather_pipeline_state, restore_history, restore_rng
from lightning_gnnpipe.strategy.checks import CHUNK_LOSS_HOOK, check_layout, check_ranks_agree
from lightning_gnnpipe.strategy.failures import handle_rank_failure
from lightning_gnnpipe.strategy.forward_patch import stack_returns
from lightning_gnnpipe.strategy.launcher import _CheckedMultiProcessingLauncher
from lightning_gnnpipe.strategy.state import merged_optimizer_state, sync_stage_tensors, tensor_owners

log = logging.getLogger(__name__)


def _not_last_stage(*_: Any) -> Tensor:
    raise RuntimeError("GNNPipeStrategy: the loss ran on a stage that is not the last one.")


class GNNPipeStrategy(ParallelStrategy):
    """Train a GNN with its layers cut into pipeline stages, one stage per process.

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
            (needs ``pipeline_chunk_loss`` on the module, see ``docs/quickstart.md``).
        refresh_on_start: Fill the history tables with an exact forward at the start of fit,
            instead of starting from zeros. On resume from a checkpoint that holds the tables,
            they are loaded instead (no refresh).
        save_history: Also store every history table in checkpoints (``|V| x d_l`` floats per
            layer), so that a resumed run continues exactly like an uninterrupted one. See
            ``docs/reliability.md``.
        timeout: Timeout of every collective (seconds as ``timedelta``); a rank that stops
            answering ends the job after this long. Default 600 s.
        start_method: ``"spawn"`` (default) or ``"popen"``; under torchrun/SLURM the processes
            already exist and this is ignored.
        process_group_backend: ``"gloo"`` (CPU default) or ``"nccl"`` (GPU default).

    Raises:
        ValueError: Unknown ``schedule`` or ``start_method`` (here); bad layouts before the
            process group starts (see :func:`~lightning_gnnpipe.strategy.checks.check_layout`).
    """

    strategy_name = "gnnpipe"

    def __init__(
        self,
        schedule: str = "gpipe",
        refresh_on_start: bool = True,
        save_history: bool = False,
        timeout: timedelta = timedelta(seconds=600),
        start_method: Literal["spawn", "popen"] = "spawn",
        process_group_backend: Optional[str] = None,
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
        self.schedule_name = check_schedule(schedule)
        if start_method not in ("spawn", "popen"):
            raise ValueError(f"GNNPipeStrategy: `start_method` must be 'spawn' or 'popen' (got {start_method!r}).")
        self.refresh_on_start = refresh_on_start
        self.save_history = save_history
        self._resume_state: Optional[Dict[str, Any]] = None
        self._timeout = timeout
        self._start_method = start_method
        self._process_group_backend = process_group_backend
        self._num_nodes = 1
        self._stack: Optional[LayerStack] = None
        self._stage: Optional[GNNStage] = None
        self._schedule = None
        self._loss: Optional[PipelineLoss] = None
        self._grads: List[tuple] = []
        self._owners: Dict[int, int] = {}
        self._layers: List[List[int]] = []

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
        """``S``: one stage per process."""
        return self.num_nodes * self.num_processes

    @property
    def stage_index(self) -> int:
        return self.global_rank

    @property
    def is_last_stage(self) -> bool:
        return self.stage_index == self.num_stages - 1

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
        super().setup_environment()
        self._setup_distributed()

    def _setup_distributed(self) -> None:
        self.set_world_ranks()
        self._process_group_backend = self._process_group_backend or _get_default_process_group_backend_for_device(
            self.root_device
        )
        assert self.cluster_environment is not None
        _init_dist_connection(self.cluster_environment, self._process_group_backend, timeout=self._timeout)

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
        """Validate model, DataModule and layout; raise before any process group starts."""
        module = module if module is not None else trainer.lightning_module
        datamodule = datamodule if datamodule is not None else trainer.datamodule
        fitting = trainer.state.fn in (None, TrainerFn.FITTING)
        return check_layout(module, datamodule, self.num_stages, self.schedule_name, fitting=fitting)

    def setup(self, trainer: Trainer) -> None:
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        assert self.model is not None
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self._build(trainer)
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)

    def _build(self, trainer: Trainer) -> None:
        dm: GraphChunkDataModule = trainer.datamodule
        stack = self._stack = self.check(trainer)
        plan, data, device = dm.plan, dm.data, self.root_device
        x = data.x.to(device)
        self._dims = infer_dims(stack.blocks, x[:2])
        layers = self._layers = split_layers(stack.num_layers, self.num_stages)
        self._owners = tensor_owners(stack.blocks, layers)
        mine = layers[self.stage_index]
        check_ranks_agree(plan.fingerprint(), self._dims[mine[0]], self._dims[mine[-1] + 1], self.stage_index)
        rank_zero_info(f"GNNPipeStrategy: stage -> layers {layers}; {plan.num_chunks} chunks of "
                       f"{min(plan.chunk_sizes)}-{plan.max_chunk_size} nodes, edge cut {plan.edge_cut:.3f}")
        blocks = [stack.blocks[i] for i in mine]
        graph = build_chunk_graph(plan, data.edge_index, blocks, device, dtype=x.dtype)
        self._stage = GNNStage(blocks, mine, self._dims, graph, x=x if 0 in mine else None)
        self._num_nodes_graph = plan.num_nodes
        self._x_pad = plan.pad(data.x).to(device) if self.stage_index == 0 else None
        self._num_chunks = plan.num_chunks
        self._schedule = None
        if trainer.state.fn == TrainerFn.FITTING:
            mode = "deferred" if self.schedule_name == "gpipe" else "chunk"
            self._loss = PipelineLoss(graph, plan.num_nodes, mode) if self.is_last_stage else None
            self._schedule = build_schedule(
                self._stage, self.stage_index, self.num_stages, device, plan.max_chunk_size,
                self._stage.in_channels, self._stage.out_channels, self.schedule_name, plan.num_chunks,
                # Every rank must pass a loss_fn: the schedules run backwards only when one is set.
                self._loss if self._loss is not None else _not_last_stage,
            )

    # ------------------------------------------------------------------ exact full-graph forward
    def _send_recv_full(self, h: Optional[Tensor], write_history: bool) -> Tensor:
        """Exact layer-by-layer forward through all stages; return logits ``(|V|, C)`` on every rank."""
        assert self._stage is not None
        n, s = self._num_nodes_graph, self.stage_index
        device = self.root_device
        if s == 0:
            h = self._stage.x
        else:
            h = torch.empty(n, self._stage.in_channels, device=device)
            dist.recv(h, src=s - 1)
        h = self._stage.forward_full(h, write_history=write_history).contiguous()
        if not self.is_last_stage:
            dist.send(h, dst=s + 1)
            h = torch.empty(n, self._dims[-1], device=device, dtype=h.dtype)
        dist.broadcast(h, src=self.num_stages - 1)
        return h

    def refresh_history(self) -> None:
        """Refill every stage's history tables with an exact no-grad full-graph forward."""
        assert self._stage is not None
        flags = [(m, m.training) for m in self._stage.modules()]
        self._stage.eval()
        try:
            self._send_recv_full(None, write_history=True)
        finally:
            for m, flag in flags:
                m.training = flag

    def on_train_start(self) -> None:
        super().on_train_start()
        assert self._stage is not None
        saved, self._resume_state = self._resume_state, None
        if not restore_history(saved, self._stage, self.lightning_module.trainer.datamodule.plan) \
                and self.refresh_on_start:
            self.refresh_history()

    # ------------------------------------------------------------------ steps
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        assert self._schedule is not None and self._stack is not None
        lm = self.lightning_module
        batch = args[0]
        for p in lm.parameters():
            p.grad = None
        ids = torch.arange(self._num_chunks, device=self.root_device)
        step_args = (self._x_pad,) if self.stage_index == 0 else ()
        step_kwargs: Dict[str, Any] = {"chunk_id": ids}
        if self.is_last_stage:
            assert self._loss is not None
            self._loss.reset(full_loss=lambda full: self._user_loss(full, batch, args, kwargs),
                             chunk_loss=lambda out, c: self._chunk_loss(out, c, batch))
            step_kwargs.update(target=ids, return_outputs=False)
        with self.precision_plugin.train_step_context():
            self._schedule.step(*step_args, **step_kwargs)
            if self.is_last_stage:
                logits = self._loss.logits()
            else:
                logits = torch.empty(self._num_nodes_graph, self._dims[-1], device=self.root_device)
            dist.broadcast(logits, src=self.num_stages - 1)
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
        assert self._stage is not None
        nodes = self._stage.graph.nodes[c]
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
            sync_stage_tensors(self.lightning_module, self._owners)
        return self.lightning_module.state_dict()

    def optimizer_state(self, optimizer: Optimizer) -> Dict[str, Any]:
        """Return one single-device-shaped optimizer state, each parameter's from its owner."""
        opt = getattr(optimizer, "_optimizer", optimizer)
        if not _distributed_is_initialized() or not self._owners:
            return opt.state_dict()
        return merged_optimizer_state(opt, self._owners, self.stage_index)

    def save_checkpoint(self, checkpoint: Dict[str, Any], filepath: Any, storage_options: Optional[Any] = None) -> None:
        """Add the pipeline's state (RNG, chunk plan, optional history tables) and write on rank 0.

        Called on every rank (the state is gathered to rank 0).
        """
        if self._stage is not None and _distributed_is_initialized():
            state = gather_pipeline_state(self._stage, self.lightning_module.trainer.datamodule.plan, self._layers,
                                          self.stage_index, self.save_history and "optimizer_states" in checkpoint)
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
            handle_rank_failure(exception, dist.get_rank(), self.num_stages, self._layers[dist.get_rank()]
                                if self._layers else None)

    def on_train_end(self) -> None:
        super().on_train_end()
        # The model that spawn hands back to the main process is rank 0's: make it complete.
        if _distributed_is_initialized() and self._owners:
            sync_stage_tensors(self.lightning_module, self._owners)

    def teardown(self) -> None:
        self._schedule = self._stage = self._loss = self._resume_state = None
        self._grads = []
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(cls.strategy_name, cls, description="GNNPipe pipelined GNN training (spawn)")
        strategy_registry.register(
            "gnnpipe_popen", cls, description="GNNPipe pipelined GNN training (popen)", start_method="popen"
        )
