"""Analytic communication volume per training step (= per epoch) of each mode, in bytes.

The formulas count the same tensors :mod:`lightning_gnnpipe.comm.accounting` counts at run
time, so a measured epoch must match them exactly (``tests/test_graph_parallel.py``):

* GNNPipe, ``S`` stages, ``K`` chunks padded to ``M`` rows: every stage boundary ``b`` of width
  ``d_b`` carries ``K M d_b`` values forward and as many gradients backward; the minimum, without
  padding, is ``|V| d_b`` each way, i.e. ``~ 2 (S-1) |V| d`` for equal widths. The logits
  ``(|V|, C)`` are broadcast from the last stage to ``S-1`` ranks. A model that carries ``x0`` (GCNII) adds block 0's
  weights and gradients where the later stages compute ``x0`` (:mod:`~lightning_gnnpipe.pipeline.initial_embedding`:
  ``weight_allreduce``, not counted here), else ``x0`` beside every boundary's rows.
* Graph parallelism, ``G`` parts with halos of total size ``H = sum_r |halo_r|``: every
  message-passing layer ``l >= 1`` moves ``H d_l`` values forward and ``H d_l`` gradients
  backward, i.e. ``~ 2 (L-1) H d`` (layer 0 reads the replicated input features); the parts'
  outputs are all-gathered (``G (G-1) M C``) and the weight gradients (``P`` values plus one
  flag per parameter tensor) ring-all-reduced (``2 (G-1) P`` over all ranks).
* Hybrid, ``S`` stages x ``G`` partitions (:mod:`lightning_gnnpipe.comm.exchange`): the stage
  boundaries carry what GNNPipe's carry for all ``K`` chunks; every layer ``l >= 1`` sends each
  cross-partition halo row once (``H_G d_l``, ``H_G`` = sum of the partitions' halos) and the
  gradients of the rows read in the same slot (``H_live d_l``); each stage all-reduces its weight
  gradients over ``G`` ranks; the logits are summed over the ``G`` last stages and broadcast in
  each pipeline.
"""

from __future__ import annotations

from typing import Dict, List

from lightning_gnnpipe.comm.accounting import KINDS, ring_all_reduce_bytes
from lightning_gnnpipe.comm.exchange import partition_halos
from lightning_gnnpipe.data.chunk import ChunkPlan
from lightning_gnnpipe.pipeline.split import split_layers


def pipeline_volume(plan: ChunkPlan, dims: List[int], num_stages: int, minimum: bool = False,
                    value_bytes: int = 4) -> Dict[str, int]:
    """Bytes GNNPipe sends in one step, by kind, summed over all ranks.

    Args:
        plan: The chunk plan (``K`` chunks of at most ``M`` nodes).
        dims: Width entering each layer and leaving the last, ``L + 1`` ints.
        num_stages: ``S``.
        minimum: Count ``|V|`` rows per boundary instead of the padded ``K M``.
        value_bytes: Bytes per value (4 for float32).
    """
    layers = split_layers(len(dims) - 1, num_stages)
    rows = plan.num_nodes if minimum else plan.num_chunks * plan.max_chunk_size
    boundary = sum(rows * dims[stage[-1] + 1] for stage in layers[:-1]) * value_bytes
    out = dict.fromkeys(KINDS, 0)
    out.update(stage_activations=boundary, stage_gradients=boundary,
               logits=(num_stages - 1) * plan.num_nodes * dims[-1] * value_bytes)
    return out


def graph_parallel_volume(plan: ChunkPlan, dims: List[int], graph_layers: List[bool], num_params: int,
                          num_param_tensors: int, value_bytes: int = 4) -> Dict[str, int]:
    """Bytes graph parallelism sends in one step, by kind, summed over all ranks.

    Args:
        plan: The partition (``G`` parts, chunk ``r`` = part ``r``).
        dims: Width entering each layer and leaving the last, ``L + 1`` ints.
        graph_layers: Whether each of the ``L`` layers passes messages.
        num_params: ``P``, trainable values of the layer blocks.
        num_param_tensors: Trainable parameter tensors of the blocks.
        value_bytes: Bytes per value.
    """
    g, halo = plan.num_chunks, sum(int(h.numel()) for h in plan.halo)
    exchanged = sum(dims[j] for j in range(1, len(graph_layers)) if graph_layers[j])
    out = dict.fromkeys(KINDS, 0)
    out.update(halo_embeddings=halo * exchanged * value_bytes, halo_gradients=halo * exchanged * value_bytes,
               logits=g * (g - 1) * plan.max_chunk_size * dims[-1] * value_bytes,
               weight_allreduce=g * ring_all_reduce_bytes(g, (num_params + num_param_tensors) * value_bytes))
    return out


def hybrid_volume(plan: ChunkPlan, dims: List[int], num_stages: int, num_parts: int, graph_layers: List[bool],
                  stage_params: List[int], minimum: bool = False, value_bytes: int = 4) -> Dict[str, int]:
    """Bytes hybrid parallelism (``S`` stages x ``G`` partitions) sends in one step, by kind, over all ranks.

    With ``G = 1`` this equals :func:`pipeline_volume`.

    Args:
        plan: The slot-major chunk plan (``K`` chunks, ``K / G`` per partition).
        dims: Width entering each layer and leaving the last, ``L + 1`` ints.
        num_stages: ``S``.
        num_parts: ``G``.
        graph_layers: Whether each of the ``L`` layers passes messages.
        stage_params: Per stage, trainable values plus parameter tensors of its blocks (the all-reduced buffer).
        minimum: Count ``|V|`` rows per stage boundary instead of the padded ``K M``.
        value_bytes: Bytes per value.
    """
    out = pipeline_volume(plan, dims, num_stages, minimum=minimum, value_bytes=value_bytes)
    G = num_parts
    if G == 1:
        return out
    slot = plan.part // G
    live = sum(int((slot[plan.halo[c]] == c // G).sum()) for c in range(plan.num_chunks))
    halo = sum(int(h.numel()) for h in partition_halos(plan, G))
    exchanged = sum(dims[j] for j in range(1, len(graph_layers)) if graph_layers[j])
    logits = plan.num_nodes * dims[-1] * value_bytes
    out.update(halo_embeddings=halo * exchanged * value_bytes, halo_gradients=live * exchanged * value_bytes,
               logits=G * (num_stages - 1) * logits + G * ring_all_reduce_bytes(G, logits),
               weight_allreduce=sum(G * ring_all_reduce_bytes(G, p * value_bytes) for p in stage_params))
    return out
