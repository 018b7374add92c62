"""Checks of a model, DataModule and strategy layout, run before any process group starts."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch.distributed as dist
from torch import nn

from lightning_gnnpipe.data.datamodule import GraphChunkDataModule
from lightning_gnnpipe.nn.feature_norm import check_feature_norms
from lightning_gnnpipe.nn.normalization import check_supported
from lightning_gnnpipe.nn.stack import LayerStack, find_layer_stack
from lightning_gnnpipe.pipeline.schedule import check_schedule, is_multi_stage
from lightning_gnnpipe.pipeline.split import split_layers

CHUNK_LOSS_HOOK = "pipeline_chunk_loss"


def check_layout(
    module: nn.Module, datamodule: Optional[object], num_stages: int, schedule: str, fitting: bool = True,
    graph_parallel_size: int = 1, stages_per_rank: int = 1,
) -> LayerStack:
    """Validate everything the pipeline needs and return the model's layer stack.

    Args:
        module: The LightningModule.
        datamodule: The ``GraphChunkDataModule``.
        num_stages: ``S``, ranks per pipeline.
        schedule: The schedule name.
        fitting: Whether the schedule will run (fit); evaluation only needs the layout.
        graph_parallel_size: ``G``.
        stages_per_rank: ``v``; the layers are cut into ``S * v`` virtual stages.

    Raises:
        TypeError: No ``GraphChunkDataModule``, or no splittable layer stack.
        ValueError: More (virtual) stages than layers, a multi-hop conv, a graph-wide norm layer (see
            :func:`~lightning_gnnpipe.nn.feature_norm.check_feature_norms`), a schedule that cannot run with
            the given ``K``, ``S`` and ``v`` (:func:`~lightning_gnnpipe.pipeline.schedule.check_schedule`), a
            non-GPipe schedule without ``pipeline_chunk_loss``, or a multi-stage schedule with ``G > 1``.
    """
    if not isinstance(datamodule, GraphChunkDataModule):
        raise TypeError(
            "GNNPipeStrategy: pass the graph as `datamodule=GraphChunkDataModule(data, num_chunks=K)` "
            f"(got datamodule={type(datamodule).__name__}). The strategy needs its chunk plan."
        )
    stack = find_layer_stack(module)
    check_supported(stack.blocks)
    check_feature_norms(stack.blocks)
    check_schedule(schedule, stages_per_rank=stages_per_rank)
    if is_multi_stage(schedule) and graph_parallel_size > 1:
        raise ValueError(
            f"GNNPipeStrategy: schedule {schedule!r} (several stages per rank) is not supported with hybrid "
            f"parallelism (got graph_parallel_size={graph_parallel_size}). Use graph_parallel_size=1, or "
            "schedule 'gpipe'/'1f1b'."
        )
    if stages_per_rank > 1 and num_stages * stages_per_rank > stack.num_layers:
        raise ValueError(
            f"GNNPipeStrategy: the model has {stack.num_layers} layers but {num_stages} devices x "
            f"{stages_per_rank} `stages_per_rank` = {num_stages * stages_per_rank} virtual stages were requested "
            f"(got devices={num_stages}, stages_per_rank={stages_per_rank}); every stage needs at least one layer. "
            f"Use at most {stack.num_layers} stages in all (fewer devices or a smaller stages_per_rank)."
        )
    try:
        split_layers(stack.num_layers, num_stages)
    except ValueError as err:
        raise ValueError(
            f"GNNPipeStrategy: the model has {stack.num_layers} layers but {num_stages} stages were "
            f"requested (one per device) (got devices={num_stages}). Use at most {stack.num_layers} devices."
        ) from err
    if fitting:
        check_schedule(schedule, datamodule.num_chunks // graph_parallel_size, num_stages, stages_per_rank)
        if schedule != "gpipe" and not callable(getattr(module, CHUNK_LOSS_HOOK, None)):
            raise ValueError(
                f"GNNPipeStrategy: schedule {schedule!r} runs backwards before all chunks have run forward, "
                f"so the full-graph `training_step` loss cannot drive it (got no `{CHUNK_LOSS_HOOK}` on "
                f"{type(module).__name__}). Define `{CHUNK_LOSS_HOOK}(self, out, batch, node_index)` "
                "(see docs/quickstart.md) or use schedule='gpipe'."
            )
    return stack


def check_stage_widths(widths: Dict[int, Tuple[List[int], List[int]]], group: Any = None) -> None:
    """Check that every stage sends what the next stage expects (a collective: call on every rank).

    Stages exchange fixed-shape buffers, so a width mismatch (a model built differently on some
    rank) would otherwise surface as a failed or hanging transfer.

    Args:
        widths: For each (virtual) stage on this rank, its index -> (widths of the tensors it receives,
            widths of the tensors it sends).
        group: The pipeline's process group (default: world).

    Raises:
        RuntimeError: On every rank, if stage ``s`` sends other widths than stage ``s + 1`` expects.
    """
    gathered: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, {k: (list(i), list(o)) for k, (i, o) in widths.items()}, group=group)
    merged: Dict[int, Any] = {}
    for part in gathered:
        merged.update(part)
    infos = [merged[s] for s in sorted(merged)]
    for s in range(len(infos) - 1):
        sent, expected = infos[s][1], infos[s + 1][0]
        if sent != expected:
            raise RuntimeError(
                f"GNNPipeStrategy: stage {s} sends embeddings of widths {sent} but stage {s + 1} expects widths "
                f"{expected} (got (in, out) widths per stage {infos}). Build the model identically on every "
                "rank: same hyperparameters, no layers that depend on the rank."
            )
