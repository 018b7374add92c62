"""The pipeline's own part of a checkpoint: RNG states, chunk plan, history tables.

Lightning's checkpoint already holds the full ``state_dict`` (synced from every stage, see
:mod:`~lightning_gnnpipe.strategy.state`), one merged optimizer state, the LR schedulers and
the loops. What only the pipeline knows is stored under ``checkpoint["gnnpipe"]``:

* ``rng_states``: every rank's torch/numpy/Python (and CUDA) generator states, one per stage
  (dropout on stage ``s`` draws from rank ``s``'s generator);
* ``fingerprint``, ``num_nodes``, ``num_chunks``, ``num_stages``, ``layers``: the chunk plan and
  layout the run used;
* ``history`` (with ``GNNPipeStrategy(save_history=True)``): every history table, keyed by
  its global layer index, ``(|V|, d_l)`` each. Keying by layer, not by stage, lets a resume
  with another number of stages put every table on the stage that now owns the layer.

Everything is plain tensors, tuples and numbers, so ``torch.load(..., weights_only=True)``
reads it. Saving is a collective (every rank sends its part to rank 0); loading is local
(every rank reads the file and keeps its own part).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import random

import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.optim import Optimizer

from lightning_gnnpipe.data.chunk import ChunkPlan
from lightning_gnnpipe.pipeline.stage import GNNStage
from lightning_gnnpipe.strategy.base import distributed_is_initialized
from lightning_gnnpipe.strategy.state import merged_optimizer_state, sync_stage_tensors

CHECKPOINT_KEY = "gnnpipe"
"""Key of the pipeline's state in a Lightning checkpoint dict."""


def collect_rng_states() -> Dict[str, Any]:
    """This process's torch, CUDA, numpy and Python generator states (the keys Lightning's checkpoints use)."""
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch.cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_states(states: Dict[str, Any]) -> None:
    """Set the generators from :func:`collect_rng_states`'s dict (CUDA and numpy only if present)."""
    torch.set_rng_state(states["torch"])
    if states.get("torch.cuda"):
        torch.cuda.set_rng_state_all(states["torch.cuda"])
    if "numpy" in states:
        np.random.set_state(states["numpy"])
    version, state, gauss = states["python"]
    random.setstate((version, tuple(state), gauss))


def _rng_to_plain(states: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(states)
    if "numpy" in out:
        kind, keys, pos, has_gauss, gauss = out["numpy"]
        out["numpy"] = (kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss),
                        float(gauss))
    version, state, gauss = out["python"]
    out["python"] = (version, tuple(state), gauss)
    return out


def _rng_from_plain(states: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(states)
    if "numpy" in out:
        kind, keys, pos, has_gauss, gauss = out["numpy"]
        out["numpy"] = (kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss)
    return out


def gather_pipeline_state(
    stage: Union[GNNStage, Sequence[GNNStage]], plan: ChunkPlan, layers: List[List[int]], rank: int,
    save_history: bool, num_partitions: int = 1,
) -> Optional[Dict[str, Any]]:
    """Collect every rank's part of the pipeline state on global rank 0 (a collective over the world).

    Args:
        stage: This rank's stage, or its stages (several per rank under multi-stage schedules).
        plan: The chunk plan of the run.
        layers: Layer indices of every pipeline position, ``S`` lists.
        rank: This rank's global rank ``g * S + s``.
        save_history: Whether to include the history tables (``|V| x d`` floats per layer, per pipeline).
        num_partitions: ``G`` pipelines (hybrid parallelism): each pipeline's tables and every rank's generators
            are saved.

    Returns:
        On rank 0 the dict stored under :data:`CHECKPOINT_KEY`; ``None`` on other ranks. ``rng_states`` holds one
        entry per global rank; ``history`` is pipeline 0's tables by layer and, with ``G > 1``,
        ``partition_history`` every pipeline's.
    """
    stages = [stage] if isinstance(stage, GNNStage) else list(stage)
    local = {
        "rng": _rng_to_plain(collect_rng_states()),
        "history": {int(k): t.emb.detach().cpu().clone() for st in stages for k, t in st.histories.items()}
        if save_history else None,
    }
    S = len(layers)
    parts: Optional[List[Any]] = [None] * (S * num_partitions) if rank == 0 else None
    dist.gather_object(local, parts, dst=0)
    if rank != 0:
        return None
    assert parts is not None
    per_partition: List[Optional[Dict[int, torch.Tensor]]] = [None] * num_partitions
    if save_history:
        for g in range(num_partitions):
            per_partition[g] = {}
            for part in parts[g * S:(g + 1) * S]:
                per_partition[g].update(part["history"])
    return {
        "fingerprint": plan.fingerprint(),
        "num_nodes": plan.num_nodes,
        "num_chunks": plan.num_chunks,
        "num_stages": S,
        "graph_parallel_size": num_partitions,
        "layers": [list(lay) for lay in layers],
        "rng_states": [part["rng"] for part in parts],
        "history": per_partition[0],
        "partition_history": per_partition if num_partitions > 1 and save_history else None,
    }


def restore_history(saved: Optional[Dict[str, Any]], stage: GNNStage, plan: ChunkPlan, partition: int = 0) -> bool:
    """Copy the saved history tables of this stage's layers into ``stage``.

    ``partition``: this rank's pipeline ``g`` under hybrid parallelism; its own tables are loaded
    (``partition_history``); a hybrid checkpoint without them is not loaded (the caller refreshes).

    Returns:
        ``True`` if every table of the stage was restored; ``False`` if the checkpoint holds no
        tables or was trained on another chunk plan (then a warning says so, and the caller
        refreshes the tables instead).

    Raises:
        ValueError: If a saved table does not fit the stage's table (another model width).
    """
    if not saved or saved.get("history") is None:
        return False
    if saved.get("fingerprint") != plan.fingerprint():
        rank_zero_warn(
            f"GNNPipeStrategy: the checkpoint's history tables belong to another chunk plan (got fingerprint "
            f"{saved.get('fingerprint')}, this run has {plan.fingerprint()}); they are not loaded. The tables "
            "are refilled as on a fresh start. Resume with the same graph and `num_chunks` to load them."
        )
        return False
    tables = saved["history"]
    if saved.get("graph_parallel_size", 1) > 1 or partition > 0:
        by_partition = saved.get("partition_history")
        if not by_partition or partition >= len(by_partition) or saved.get("graph_parallel_size") != len(by_partition):
            return False
        tables = by_partition[partition]
    for key, table in stage.histories.items():
        value = tables.get(int(key))
        if value is not None and table.node_ids is not None and value.dim() == 2 and value.size(0) == plan.num_nodes:
            value = value[table.node_ids.cpu()]  # a table of every node (older or hand-made): its boundary rows
        if value is None or value.shape != table.emb.shape:
            raise ValueError(
                f"GNNPipeStrategy: the checkpoint's history table of layer {key} does not fit the model (got "
                f"{None if value is None else tuple(value.shape)}, expected {tuple(table.emb.shape)}). "
                "Resume with the model the checkpoint was trained with."
            )
        table.emb.copy_(value)
    return True


def restore_rng(saved: Optional[Dict[str, Any]], rank: int, num_stages: int, num_partitions: int = 1) -> bool:
    """Set this rank's random generators to the states saved by the same rank (global rank ``g * S + s``).

    Returns:
        ``True`` if restored; ``False`` if the checkpoint has no states, or was written by a run
        with another number of stages or pipelines (then a warning says that dropout draws will differ).
    """
    if not saved or not saved.get("rng_states"):
        return False
    if saved.get("num_stages") != num_stages or saved.get("graph_parallel_size", 1) != num_partitions:
        rank_zero_warn(
            f"GNNPipeStrategy: the checkpoint was written with {saved.get('num_stages')} stages, this run has "
            f"{num_stages} (pipelines: {saved.get('graph_parallel_size', 1)} and {num_partitions}; got layers "
            f"{saved.get('layers')}); weights, optimizer state and history tables "
            "are restored, random generator states are not, so dropout draws differ from an uninterrupted run."
        )
        return False
    set_rng_states(_rng_from_plain(saved["rng_states"][rank]))
    return True


class PipelineCheckpointHooks:
    """The checkpoint hooks of :class:`~lightning_gnnpipe.GNNPipeStrategy` (a mixin over its Lightning base).

    Every rank holds the whole LightningModule, but only a layer's stage trains it: before a checkpoint is
    written, and at the end of fit, every owned tensor is broadcast from its owner
    (:mod:`~lightning_gnnpipe.strategy.state`), and the pipeline's own state goes under :data:`CHECKPOINT_KEY`.
    """

    def lightning_module_state_dict(self) -> Dict[str, Any]:
        """Return the full model's ``state_dict`` (every stage's weights, original names)."""
        if distributed_is_initialized() and self._owners:
            sync_stage_tensors(self.lightning_module, self._owners, group=self._pp_group)
        return self.lightning_module.state_dict()

    def optimizer_state(self, optimizer: Optimizer) -> Dict[str, Any]:
        """Return one single-device-shaped optimizer state, each parameter's from its owner."""
        if not distributed_is_initialized() or not self._owners:
            return super().optimizer_state(optimizer)
        opt = optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer  # a LightningOptimizer
        return merged_optimizer_state(opt, self._owners, self.stage_index, group=self._pp_group)

    def save_checkpoint(self, checkpoint: Dict[str, Any], filepath: Any, storage_options: Optional[Any] = None) -> None:
        """Add the pipeline's state (RNG, chunk plan, optional history tables) and write on rank 0.

        Called on every rank (the state is gathered to rank 0).
        """
        if self._runtime is not None and distributed_is_initialized():
            state = gather_pipeline_state(self._runtime.stages, self.lightning_module.trainer.datamodule.plan,
                                          self._layers, self.global_rank,
                                          self.save_history and "optimizer_states" in checkpoint,
                                          self.graph_parallel_size)
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
        restore_rng(checkpoint.get(CHECKPOINT_KEY), self.global_rank, self.num_stages, self.graph_parallel_size)

    def on_train_end(self) -> None:
        super().on_train_end()
        # The model that spawn hands back to the main process is rank 0's: make it complete.
        if distributed_is_initialized() and self._owners:
            sync_stage_tensors(self.lightning_module, self._owners, group=self._pp_group)
