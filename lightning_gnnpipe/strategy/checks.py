"""Checks of a model, DataModule and strategy layout, run before any process group starts."""

from __future__ import annotations

from typing import Any, List, Optional

import torch.distributed as dist
from torch import nn

from lightning_gnnpipe.data.datamodule import GraphChunkDataModule
from lightning_gnnpipe.nn.normalization import check_supported
from lightning_gnnpipe.nn.stack import LayerStack, find_layer_stack
from lightning_gnnpipe.pipeline.schedule import check_schedule
from lightning_gnnpipe.pipeline.split import split_layers

CHUNK_LOSS_HOOK = "pipeline_chunk_loss"


def check_layout(
    module: nn.Module, datamodule: Optional[object], num_stages: int, schedule: str, fitting: bool = True
) -> LayerStack:
    """Validate everything the pipeline needs and return the model's layer stack.

    Raises:
        TypeError: No ``GraphChunkDataModule``, or no splittable layer stack.
        ValueError: More stages than layers, a multi-hop conv, a schedule that cannot run with
            the given ``K`` and ``S``, or a non-GPipe schedule without ``pipeline_chunk_loss``.
    """
    if not isinstance(datamodule, GraphChunkDataModule):
        raise TypeError(
            "GNNPipeStrategy: pass the graph as `datamodule=GraphChunkDataModule(data, num_chunks=K)` "
            f"(got datamodule={type(datamodule).__name__}). The strategy needs its chunk plan."
        )
    stack = find_layer_stack(module)
    check_supported(stack.blocks)
    try:
        split_layers(stack.num_layers, num_stages)
    except ValueError as err:
        raise ValueError(
            f"GNNPipeStrategy: the model has {stack.num_layers} layers but {num_stages} stages were "
            f"requested (one per device) (got devices={num_stages}). Use at most {stack.num_layers} devices."
        ) from err
    if fitting:
        check_schedule(schedule, datamodule.num_chunks, num_stages)
        if schedule != "gpipe" and not callable(getattr(module, CHUNK_LOSS_HOOK, None)):
            raise ValueError(
                f"GNNPipeStrategy: schedule {schedule!r} runs backwards before all chunks have run forward, "
                f"so the full-graph `training_step` loss cannot drive it (got no `{CHUNK_LOSS_HOOK}` on "
                f"{type(module).__name__}). Define `{CHUNK_LOSS_HOOK}(self, out, batch, node_index)` "
                "(see docs/quickstart.md) or use schedule='gpipe'."
            )
    return stack


def check_ranks_agree(fingerprint: str, in_channels: int, out_channels: int, stage_index: int) -> None:
    """Check that all ranks built the same chunk plan and that adjacent stages' widths match.

    A collective (``all_gather_object``): call it on every rank. Stages exchange fixed-shape
    buffers, so a width mismatch would otherwise surface as a failed or hanging transfer.

    Raises:
        RuntimeError: On every rank, if the ranks' chunk plans or stage widths disagree.
    """
    infos: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(infos, (fingerprint, in_channels, out_channels, stage_index))
    prints = [i[0] for i in infos]
    if len(set(prints)) != 1:
        raise RuntimeError(
            f"GNNPipeStrategy: ranks built different chunk plans (got fingerprints {prints}). "
            "Build the GraphChunkDataModule from the same graph on every rank, or pass `part=`."
        )
    for s in range(len(infos) - 1):
        sent, expected = infos[s][2], infos[s + 1][1]
        if sent != expected:
            raise RuntimeError(
                f"GNNPipeStrategy: stage {s} sends embeddings of width {sent} but stage {s + 1} expects width "
                f"{expected} (got (in, out) widths per stage {[(i[1], i[2]) for i in infos]}). Build the model "
                "identically on every rank: same hyperparameters, no layers that depend on the rank."
            )
