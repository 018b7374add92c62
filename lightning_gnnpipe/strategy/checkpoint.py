"""The pipeline's own part of a checkpoint: RNG states, chunk plan, history tables.

Lightning's checkpoint already holds the full ``state_dict`` (synced from every stage, see
:mod:`~lightning_gnnpipe.strategy.state`), one merged optimizer state, the LR schedulers and
the loops. What only the pipeline knows is stored under ``checkpoint["gnnpipe"]``:

* ``rng_states``: every rank's torch/numpy/Python generator states and the CUDA generator of its own device,
  one per rank (dropout on stage ``s`` draws from rank ``s``'s generator);
* ``fingerprint``, ``num_nodes``, ``num_chunks``, ``num_stages``, ``layers``: the chunk plan and
  layout the run used;
* ``history_tables`` (with ``GNNPipeStrategy(save_history=True)``): where the history tables are and their shapes.
  Every rank writes its own tables, from its own device, with ``torch.distributed.checkpoint`` into the directory
  ``<checkpoint file>.history`` beside the file (one ``.distcp`` file per rank and a ``.metadata`` file); nothing
  is gathered onto one rank. A table's key is ``partition<g>/layer<l>`` (global layer index ``l``, pipeline ``g``),
  not its stage, so a resume with another number of stages reads every table on the rank that now owns the layer.

The file itself is plain tensors, tuples and numbers, so ``torch.load(..., weights_only=True)``
reads it. Saving is a collective (every rank sends its generator states to rank 0 and writes its tables); loading is
local (every rank reads the file and its own tables). Checkpoints that hold the tables inline under ``history``
(written before the tables moved beside the file) still load.
"""

from __future__ import annotations

import os
import random
import shutil
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.optim import Optimizer

from lightning_gnnpipe.data.chunk import ChunkPlan
from lightning_gnnpipe.pipeline.stage import GNNStage
from lightning_gnnpipe.strategy.base import distributed_is_initialized
from lightning_gnnpipe.strategy.state import merged_optimizer_state, sync_stage_tensors

CHECKPOINT_KEY = "gnnpipe"
"""Key of the pipeline's state in a Lightning checkpoint dict."""


HISTORY_SUFFIX = ".history"
"""A checkpoint file ``f`` keeps its history tables in the directory ``f + HISTORY_SUFFIX``."""


def collect_rng_states(device: Optional[torch.device] = None) -> Dict[str, Any]:
    """This process's torch, numpy and Python generator states, and the CUDA generator of ``device`` if on CUDA.

    Only the rank's own CUDA device is saved (not ``torch.cuda.get_rng_state_all()``, which touches every visible GPU
    from every rank and cannot be set again on a machine that shows fewer GPUs).
    """
    states = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if device is not None and torch.device(device).type == "cuda":
        states["torch.cuda"] = torch.cuda.get_rng_state(device)
    return states


def set_rng_states(states: Dict[str, Any], device: Optional[torch.device] = None) -> None:
    """Set the generators from :func:`collect_rng_states`'s dict (CUDA and numpy only if present).

    The CUDA state goes to ``device`` when that is a CUDA device; an older checkpoint's list of every GPU's state
    gives ``device``'s entry (by its index), if it has one.
    """
    torch.set_rng_state(states["torch"])
    cuda = states.get("torch.cuda")
    if device is not None and torch.device(device).type == "cuda" and cuda is not None and len(cuda):
        device = torch.device(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        state = cuda if isinstance(cuda, torch.Tensor) else (cuda[index] if index < len(cuda) else None)
        if state is not None:
            torch.cuda.set_rng_state(state, device)
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


def table_key(layer: int, partition: int = 0) -> str:
    """Key of the history table of global layer ``layer`` of pipeline ``partition`` in the tables' checkpoint."""
    return f"partition{partition}/layer{layer}"


def save_history_tables(stages: Sequence[GNNStage], directory: str, partition: int = 0) -> Dict[str, Tuple[int, ...]]:
    """Write this rank's history tables into ``directory`` with ``torch.distributed.checkpoint`` (a collective).

    Every rank of the world calls it; each writes its own tables from its own device (one ``.distcp`` file per rank),
    rank 0 also the ``.metadata`` file. Nothing is gathered onto one rank.

    Args:
        stages: This rank's stages.
        directory: The tables' directory (created; files of an earlier save are overwritten).
        partition: This rank's pipeline ``g``.

    Returns:
        Shape of every table this rank wrote, by :func:`table_key`.
    """
    tables = {table_key(int(k), partition): t.emb for st in stages for k, t in st.histories.items()}
    # overwrite=True: a checkpoint saved again under its name (``last.ckpt``) replaces its tables
    dcp.save(tables, storage_writer=dcp.FileSystemWriter(directory, overwrite=True))
    return {key: tuple(t.shape) for key, t in tables.items()}


def read_history_tables(checkpoint_path: Any) -> Dict[str, torch.Tensor]:
    """Read every history table of a checkpoint written with ``save_history=True`` (one process, on the CPU).

    Returns:
        The tables by :func:`table_key` (``{}`` if the checkpoint has none).
    """
    state = torch.load(checkpoint_path, weights_only=True, map_location="cpu").get(CHECKPOINT_KEY) or {}
    inline = state.get("history")
    if inline is not None:  # a checkpoint that holds the tables inline (pipeline 0's)
        return {table_key(int(k)): v for k, v in inline.items()}
    where = state.get("history_tables")
    if not where:
        return {}
    tables = {key: torch.empty(shape) for key, shape in where["shapes"].items()}
    _load(tables, _beside(checkpoint_path, where["dir"]), dtypes=True)
    return tables


def _beside(checkpoint_path: Any, name: str) -> str:
    return os.path.join(os.path.dirname(os.fspath(checkpoint_path)), name)


def _load(tables: Dict[str, torch.Tensor], directory: str, dtypes: bool = False) -> None:
    """Read ``tables`` (by key) from ``directory`` into the given tensors in place, in this process only."""
    if dtypes:  # take the saved dtypes (bfloat16 tables stay bfloat16)
        meta = dcp.FileSystemReader(directory).read_metadata().state_dict_metadata
        for key in tables:
            tables[key] = tables[key].to(meta[key].properties.dtype)
    with warnings.catch_warnings():  # "torch.distributed is disabled ... load in a single process": intended
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(tables, checkpoint_id=directory, no_dist=True)


def tables_to_save(save_history: bool, checkpoint: Mapping[str, Any]) -> bool:
    """Whether to write the history tables beside ``checkpoint``: with ``save_history``, unless it is weights-only (no
    optimizer states, ``ModelCheckpoint(save_weights_only=True)``: it cannot resume training, all the tables are for);
    then a ``UserWarning`` says that its tables are not written."""
    if save_history and "optimizer_states" not in checkpoint:
        rank_zero_warn("GNNPipeStrategy: `save_history=True`, but this checkpoint is weights-only (no optimizer "
                       "states: it cannot resume training), so its history tables are not written. Save full "
                       "checkpoints (`ModelCheckpoint(save_weights_only=False)`) to keep them.")
        return False
    return save_history


def gather_pipeline_state(
    stage: Union[GNNStage, Sequence[GNNStage]], plan: ChunkPlan, layers: List[List[int]], rank: int,
    save_history: bool, num_partitions: int = 1, directory: Optional[str] = None,
    device: Optional[torch.device] = None,
) -> Optional[Dict[str, Any]]:
    """Collect every rank's generator states on global rank 0 and write the history tables (a collective).

    Args:
        stage: This rank's stage, or its stages (several per rank under multi-stage schedules).
        plan: The chunk plan of the run.
        layers: Layer indices of every pipeline position, ``S`` lists.
        rank: This rank's global rank ``g * S + s``.
        save_history: Whether to write the history tables (``|V| x d`` values per layer, per pipeline) into
            ``directory`` (:func:`save_history_tables`; every rank writes its own).
        num_partitions: ``G`` pipelines (hybrid parallelism): each pipeline's tables and every rank's generators
            are saved.
        directory: The tables' directory (needed with ``save_history``).
        device: This rank's device (its CUDA generator is saved).

    Returns:
        On rank 0 the dict stored under :data:`CHECKPOINT_KEY`; ``None`` on other ranks. ``rng_states`` holds one
        entry per global rank; ``history_tables`` the directory's name and every table's shape.
    """
    stages = [stage] if isinstance(stage, GNNStage) else list(stage)
    S = len(layers)
    shapes: Optional[Dict[str, Tuple[int, ...]]] = None
    if save_history:
        assert directory is not None
        shapes = save_history_tables(stages, directory, rank // S)
    local = {"rng": _rng_to_plain(collect_rng_states(device)), "shapes": shapes}
    parts: Optional[List[Any]] = [None] * (S * num_partitions) if rank == 0 else None
    dist.gather_object(local, parts, dst=0)
    if rank != 0:
        return None
    assert parts is not None
    tables = None
    if save_history:
        assert directory is not None
        tables = {"dir": os.path.basename(os.path.normpath(directory)),
                  "shapes": {key: shape for part in parts for key, shape in part["shapes"].items()}}
    return {
        "fingerprint": plan.fingerprint(),
        "num_nodes": plan.num_nodes,
        "num_chunks": plan.num_chunks,
        "num_stages": S,
        "graph_parallel_size": num_partitions,
        "layers": [list(lay) for lay in layers],
        "rng_states": [part["rng"] for part in parts],
        "history": None,
        "history_tables": tables,
    }


def restore_history(saved: Optional[Dict[str, Any]], stage: GNNStage, plan: ChunkPlan, partition: int = 0) -> bool:
    """Copy the saved history tables of this stage's layers into ``stage``.

    The tables come from the checkpoint's directory of tables (``history_tables``, read by this process alone;
    :meth:`PipelineCheckpointHooks.load_checkpoint` resolves its path), or from the dict itself (``history``: the
    inline tables of older checkpoints, pipeline 0's; ``partition_history``: every pipeline's under hybrid
    parallelism). ``partition``: this rank's pipeline ``g``.

    Returns:
        ``True`` if every table of the stage was restored; ``False`` if the checkpoint holds no
        tables, its directory of tables is missing, or it was trained on another chunk plan (then a warning says
        so, and the caller refreshes the tables instead).

    Raises:
        ValueError: If a saved table does not fit the stage's table (another model width).
    """
    if not saved or (saved.get("history") is None and not saved.get("history_tables")):
        return False
    if saved.get("fingerprint") != plan.fingerprint():
        rank_zero_warn(
            f"GNNPipeStrategy: the checkpoint's history tables belong to another chunk plan (got fingerprint "
            f"{saved.get('fingerprint')}, this run has {plan.fingerprint()}); they are not loaded. The tables "
            "are refilled as on a fresh start. Resume with the same graph and `num_chunks` to load them."
        )
        return False
    where = saved.get("history_tables")
    if where:
        shapes = {int(key.rpartition("layer")[2]): tuple(shape) for key, shape in where["shapes"].items()
                  if key.startswith(f"partition{partition}/")}
        tables: Dict[int, Any] = {}
    else:
        tables = saved["history"]
        if saved.get("graph_parallel_size", 1) > 1 or partition > 0:
            by_partition = saved.get("partition_history")
            if not by_partition or partition >= len(by_partition) or saved.get("graph_parallel_size") != len(
                    by_partition):
                return False
            tables = by_partition[partition]
        tables = dict(tables)
        shapes = {int(k): tuple(v.shape) for k, v in tables.items()}
    for key, table in stage.histories.items():
        if not where and table.node_ids is not None:
            value = tables.get(int(key))
            if value is not None and value.dim() == 2 and value.size(0) == plan.num_nodes != table.emb.size(0):
                tables[int(key)] = value[table.node_ids.cpu()]  # a table of every node (older or hand-made)
                shapes[int(key)] = tuple(tables[int(key)].shape)  # gives its boundary rows
        shape = shapes.get(int(key))
        if shape != tuple(table.emb.shape):
            raise ValueError(
                f"GNNPipeStrategy: the checkpoint's history table of layer {key} does not fit the model (got "
                f"{shape}, expected {tuple(table.emb.shape)}). Resume with the model the checkpoint was trained with."
            )
    if where:
        if not os.path.isdir(where["dir"]):
            rank_zero_warn(f"GNNPipeStrategy: the checkpoint's history tables are missing (got no directory "
                           f"{where['dir']!r}); the tables are refilled as on a fresh start. Keep the directory "
                           "beside the checkpoint file.")
            return False
        _load({table_key(int(k), partition): t.emb for k, t in stage.histories.items()}, where["dir"])
        return True
    for key, table in stage.histories.items():
        table.emb.copy_(tables[int(key)])
    return True


def restore_tables(saved: Optional[Dict[str, Any]], stages: Sequence[GNNStage], plan: ChunkPlan,
                   partition: int = 0) -> bool:
    """Restore the history tables of every stage of this rank, the same decision on every rank (a collective).

    Returns:
        ``True`` if every rank restored every table of its stages (:func:`restore_history`); otherwise ``False``
        on every rank (each then refreshes, so that no rank waits in a refresh the others skip).
    """
    restored = bool(stages) and all([restore_history(saved, stage, plan, partition) for stage in stages])
    if not (dist.is_available() and dist.is_initialized()) or not stages:
        return restored
    flag = torch.tensor([int(restored)], device=stages[0].graph.nodes[0].device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def restore_rng(saved: Optional[Dict[str, Any]], rank: int, num_stages: int, num_partitions: int = 1,
                device: Optional[torch.device] = None) -> bool:
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
    set_rng_states(_rng_from_plain(saved["rng_states"][rank]), device)
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
        """Add the pipeline's state (RNG, chunk plan), write the history tables beside the file, write it on rank 0.

        Called on every rank (the generator states are gathered to rank 0; each rank writes its own tables into
        ``<filepath>.history``, :func:`save_history_tables`).
        """
        if self._runtime is not None and distributed_is_initialized():
            state = gather_pipeline_state(self._runtime.stages, self.lightning_module.trainer.datamodule.plan,
                                          self._layers, self.global_rank, tables_to_save(self.save_history, checkpoint),
                                          self.graph_parallel_size, os.fspath(filepath) + HISTORY_SUFFIX,
                                          self.root_device)
            if state is not None:
                checkpoint[CHECKPOINT_KEY] = state
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def remove_checkpoint(self, filepath: Any) -> None:
        """Remove a checkpoint file and, on rank 0, its directory of history tables (``ModelCheckpoint``'s cleanup)."""
        super().remove_checkpoint(filepath)
        if self.is_global_zero:
            shutil.rmtree(os.fspath(filepath) + HISTORY_SUFFIX, ignore_errors=True)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: Optional[bool] = None) -> Dict[str, Any]:
        """Load the checkpoint on every rank and keep the pipeline's state for ``on_train_start``.

        The directory of history tables is looked up beside ``checkpoint_path`` (where it was written).
        """
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        state = checkpoint.get(CHECKPOINT_KEY)
        if state is not None and state.get("history_tables"):
            where = state["history_tables"]
            state = {**state, "history_tables": {**where, "dir": _beside(checkpoint_path, where["dir"])}}
        self._resume_state = state
        return checkpoint

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Restore the optimizers, then this stage's random generators.

        Restoring the generators here, before the fit loop builds its first data iterator (which
        draws a seed), replays exactly the draws an uninterrupted run makes after the save.
        """
        super().load_optimizer_state_dict(checkpoint)
        restore_rng(checkpoint.get(CHECKPOINT_KEY), self.global_rank, self.num_stages, self.graph_parallel_size,
                    self.root_device)

    def on_train_end(self) -> None:
        super().on_train_end()
        # The model that spawn hands back to the main process is rank 0's: make it complete.
        if distributed_is_initialized() and self._owners:
            sync_stage_tensors(self.lightning_module, self._owners, group=self._pp_group)
