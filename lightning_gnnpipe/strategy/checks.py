"""Checks of a model, DataModule and strategy layout, run before any process group starts."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple

import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import nn

from lightning_gnnpipe.data.datamodule import GraphChunkDataModule
from lightning_gnnpipe.history.halo_grad import HALO_GRADIENTS
from lightning_gnnpipe.nn.dropout import first_dropout
from lightning_gnnpipe.nn.feature_norm import check_feature_norms
from lightning_gnnpipe.nn.gcn_norm import check_one_hop
from lightning_gnnpipe.nn.stack import LayerStack, find_layer_stack
from lightning_gnnpipe.pipeline.schedule import check_schedule, check_torch_for, is_multi_stage
from lightning_gnnpipe.pipeline.split import split_layers


def check_not_multi_stage_hybrid(schedule: str, graph_parallel_size: int) -> None:
    """Refuse a multi-stage schedule (several stages per rank) with hybrid parallelism, before any process starts.

    Raises:
        ValueError: ``schedule`` runs several stages per rank and ``graph_parallel_size`` > 1.
    """
    if is_multi_stage(schedule) and graph_parallel_size > 1:
        raise ValueError(
            f"GNNPipeStrategy: the multi-stage schedule {schedule!r} is not supported with hybrid "
            f"parallelism (got graph_parallel_size={graph_parallel_size}). Use graph_parallel_size=1, or "
            "schedule 'gpipe'/'1f1b'."
        )


EVALUATIONS = ("auto", "graph_parallel", "pipeline")

REFRESH_AUTO = "auto"
"""``refresh_every="auto"`` (the default): refresh every epoch where the fit's validation is the refresh
(:func:`resolve_refresh_every`)."""


AUTO_MAX_BYTES_RATIO = 2.0
"""``"auto"`` evaluates the graph-parallel way only while its halo exchange sends at most this many times the bytes of
the pipelined forward (:func:`~lightning_gnnpipe.strategy.graph_parallel_eval.exchange_bytes_ratio`): it halves each
rank's compute, so it pays where compute weighs about as much as the link. On the 300k-node graph of
``docs/results/notes/time_to_accuracy.md`` (ratio 1.42, GCNII-16 with ``x0`` sent beside the rows) it took 0.43x the
pipelined evaluation's time on the free link and 1.03x and 1.11x at the 100 and 10 Gbit/s rates. With ``x0`` computed
on each stage the pipelined forward sends half as much there (ratio 2.83): ``"auto"`` keeps it, 11.6 s at the
100 Gbit/s rate. On its spread graph (ratio 12.95) the graph-parallel way took 73.6 s against 14.2 s there."""


def resolve_evaluation(evaluation: str, graph_parallel_size: int, num_chunks: int, num_stages: int,
                       autocast: bool = False, bytes_ratio: Optional[Callable[[], float]] = None) -> str:
    """The exact forward evaluation runs: ``"auto"`` is ``"graph_parallel"`` when there is one partition and at least
    one chunk per stage rank (``G = 1``, ``K >= S``), no autocast (``bf16-mixed`` rounds the pipelined forward's
    rows at every stage boundary, which the graph-parallel forward has not) and, where ``bytes_ratio`` is given (it
    needs the chunk plan: at the first evaluation), its halo exchange sends at most :data:`AUTO_MAX_BYTES_RATIO` times
    the pipelined forward's bytes; else ``"pipeline"``.

    Raises:
        ValueError: ``"graph_parallel"`` named with fewer chunks than stages (a rank would have none).
    """
    if evaluation == "graph_parallel" and num_chunks < num_stages:
        raise ValueError(f"GNNPipeStrategy: `evaluation='graph_parallel'` gives every one of the {num_stages} stage "
                         f"ranks a group of chunks, so it needs num_chunks >= {num_stages} (got {num_chunks}). Use "
                         "more chunks or evaluation='pipeline'.")
    if evaluation == "auto":
        fits = graph_parallel_size == 1 and num_chunks >= num_stages and not autocast
        return "graph_parallel" if fits and (bytes_ratio is None or bytes_ratio() <= AUTO_MAX_BYTES_RATIO) \
            else "pipeline"
    return evaluation


def resolve_refresh_every(refresh_every: Any, trainer: Any, module: Any, autocast: bool = False) -> int:
    """The refresh period a fit runs: ``"auto"`` is ``1`` where every refresh is the fit's validation just before it
    (:meth:`~lightning_gnnpipe.history.lifecycle.HistoryLifecycle.refresh_in_evaluation`): a module with a
    ``validation_step``, ``limit_val_batches`` not 0, ``check_val_every_n_epoch == 1`` and no autocast (a refresh
    runs in full precision). The validation's exact forward then writes the tables at no extra forward, and the
    training forward of each epoch reads exact halo rows. Else ``0`` (a refresh would cost an exact forward per epoch),
    said in one info line in a fit.

    Args:
        refresh_every: The strategy's option: ``"auto"`` or an int >= 0 (returned as it is).
        trainer: The Lightning ``Trainer``.
        module: The ``LightningModule``.
        autocast: Whether evaluation runs under autocast (``bf16-mixed``).

    Returns:
        The period in epochs (0: never).

    Raises nothing: a bad ``refresh_every`` is refused before any process starts (:func:`check_pipeline_options`).
    """
    if refresh_every != REFRESH_AUTO:
        return int(refresh_every)
    limit, every = trainer.limit_val_batches, trainer.check_val_every_n_epoch
    why = ("the module has no validation_step" if not is_overridden("validation_step", module)
           else f"limit_val_batches={limit!r}" if limit == 0
           else f"check_val_every_n_epoch={every!r}" if every != 1
           else "evaluation runs under bf16-mixed autocast" if autocast else None)
    if why is not None and trainer.state.fn == TrainerFn.FITTING:
        rank_zero_info(f"GNNPipeStrategy: refresh_every='auto' -> 0 ({why}): halo rows are read historical; "
                       "refresh_every=1 makes them exact at one exact forward per epoch.")
    return 0 if why else 1


HALO_AUTO = "auto"
"""``halo_gradients="auto"``: resolved per fit by :func:`resolve_halo_gradients`."""


def resolve_halo_gradients(halo_gradients: str, refresh_every: int, schedule: str, graph_parallel_size: int,
                           blocks: Sequence[nn.Module] = (), fitting: bool = False, steps_per_epoch: int = 1) -> str:
    """What a fit does with the gradients that reach halo rows: ``"auto"`` is ``"fresh"`` where the history tables are
    exact at each epoch's start (``refresh_every == 1``), one pipeline runs (``graph_parallel_size == 1``), one step
    runs every chunk (``steps_per_epoch == 1``), the
    schedule runs each stage's chunks' backwards in the order of their forwards (``"auto"``, ``"gpipe"``,
    ``"1f1b"``) and no block drops out (:func:`~lightning_gnnpipe.nn.dropout.first_dropout`): the rows read from the
    tables are then the owners' training rows, and what it adds is the full-graph gradient along the cut edges the
    chunk order allows
    (:mod:`~lightning_gnnpipe.history.halo_grad`). Else ``"detach"``; where dropout alone decides, one info line in a
    fit says so (the refresh computes the rows without dropout: their gradients are not those of the owners' rows).
    The dropout rule reads user classes' source, which a rank might read otherwise than another (a file changed on
    disk between their starts): a strategy resolves it on one rank and broadcasts the result, since every stage must
    run the chunks in the same order (``"fresh"`` reverses it in odd epochs).

    Args:
        halo_gradients: The strategy's option (``"auto"`` or one of
            :data:`~lightning_gnnpipe.history.halo_grad.HALO_GRADIENTS`, returned as it is).
        refresh_every: The fit's refresh period (:func:`resolve_refresh_every`).
        schedule: The strategy's schedule name.
        graph_parallel_size: ``G``.
        blocks: The model's layer blocks.
        fitting: Whether the trainer fits (only then the info line).
        steps_per_epoch: Training steps an epoch (the DataModule's ``K / chunks_per_step``); with several the rows
            of other steps' chunks carry no gradient back (GNNAutoScale's rule): ``"detach"``.

    Raises nothing: a bad ``halo_gradients`` is refused before any process starts (:func:`check_pipeline_options`,
    :func:`check_steps`).
    """
    if halo_gradients != HALO_AUTO:
        return halo_gradients
    if refresh_every != 1 or graph_parallel_size != 1 or is_multi_stage(schedule) or steps_per_epoch != 1:
        return "detach"
    dropout = first_dropout(blocks)
    if dropout is not None and fitting:
        rank_zero_info(f"GNNPipeStrategy: halo_gradients='auto' -> 'detach' ({dropout}): the halo rows read from the "
                       "tables are computed without dropout, so their gradients are not the owners'; "
                       "halo_gradients='fresh' hands them on anyway.")
    return "detach" if dropout is not None else "fresh"


def check_pipeline_options(schedule: str, stages_per_rank: int, refresh_every: Any, history_momentum: float,
                           halo_gradients: str, graph_parallel_size: int, history_dtype: Any = None,
                           evaluation: str = "auto") -> Tuple[str, Optional[torch.dtype], str]:
    """Validate :class:`~lightning_gnnpipe.GNNPipeStrategy`'s own options.

    Returns:
        The schedule's name, the history tables' dtype (``None``: torch's default; a name such as
        ``"bfloat16"`` becomes ``torch.bfloat16``) and ``evaluation``.

    Raises:
        ValueError: Unknown ``schedule`` or a ``stages_per_rank`` it does not take
            (:func:`~lightning_gnnpipe.pipeline.schedule.check_schedule`), ``refresh_every`` neither ``"auto"`` nor an
            int >= 0, ``history_momentum`` outside ``[0, 1)``, ``halo_gradients`` neither ``"auto"`` nor known,
            ``graph_parallel_size`` not an int >= 1, ``halo_gradients`` ``"stale"``/``"fresh"`` with hybrid
            parallelism or a multi-stage schedule, or a multi-stage schedule with hybrid parallelism, a schedule this
            torch cannot run (:func:`~lightning_gnnpipe.pipeline.schedule.check_torch_for`), a
            ``history_dtype`` that is not a floating-point torch dtype or its name, an ``evaluation`` not in
            :data:`EVALUATIONS`, or ``"graph_parallel"`` with ``G > 1``.
    """
    name = check_schedule(schedule, stages_per_rank=stages_per_rank)
    dtype = getattr(torch, history_dtype, None) if isinstance(history_dtype, str) else history_dtype
    if history_dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"GNNPipeStrategy: `history_dtype` must be a floating-point torch dtype or its name, e.g. "
                         f"torch.bfloat16 or 'bfloat16' (got {history_dtype!r}). Use None for float32 tables.")
    if refresh_every != REFRESH_AUTO and (isinstance(refresh_every, bool) or not isinstance(refresh_every, int)
                                          or refresh_every < 0):
        raise ValueError(f"GNNPipeStrategy: `refresh_every` must be {REFRESH_AUTO!r} or an int >= 0 epochs "
                         f"(got {refresh_every!r}).")
    if not 0.0 <= history_momentum < 1.0:
        raise ValueError(f"GNNPipeStrategy: `history_momentum` must be in [0, 1) (got {history_momentum}).")
    if halo_gradients != HALO_AUTO and halo_gradients not in HALO_GRADIENTS:
        raise ValueError(f"GNNPipeStrategy: `halo_gradients` must be {HALO_AUTO!r} or one of {HALO_GRADIENTS} "
                         f"(got {halo_gradients!r}).")
    G = graph_parallel_size
    if isinstance(G, bool) or not isinstance(G, int) or G < 1:
        raise ValueError(f"GNNPipeStrategy: `graph_parallel_size` must be an int >= 1 (got {G!r}).")
    if G > 1 and halo_gradients not in ("detach", HALO_AUTO):
        raise ValueError(
            f"GNNPipeStrategy: `halo_gradients={halo_gradients!r}` is not supported with `graph_parallel_size` > 1 "
            f"(got graph_parallel_size={G}). Use halo_gradients='detach'."
        )
    if is_multi_stage(name) and halo_gradients not in ("detach", HALO_AUTO):
        raise ValueError(
            f"GNNPipeStrategy: `halo_gradients={halo_gradients!r}` is not supported with the multi-stage schedule "
            f"{name!r} (got halo_gradients={halo_gradients!r}). Use halo_gradients='detach', or "
            "schedule 'gpipe'/'1f1b'."
        )
    check_not_multi_stage_hybrid(name, G)
    check_torch_for(name)
    if evaluation not in EVALUATIONS:
        raise ValueError(f"GNNPipeStrategy: `evaluation` must be one of {EVALUATIONS} (got {evaluation!r}).")
    if evaluation == "graph_parallel" and G > 1:
        raise ValueError(f"GNNPipeStrategy: `evaluation='graph_parallel'` needs graph_parallel_size=1 (got {G}); "
                         "the hybrid evaluates with evaluation='pipeline' (or 'auto').")
    return name, dtype, evaluation


def check_steps(datamodule: GraphChunkDataModule, halo_gradients: str, where: str = "GNNPipeStrategy") -> None:
    """Refuse, before any process starts, what several steps an epoch (``chunks_per_step < num_chunks``) cannot do.

    Raises:
        ValueError: ``halo_gradients`` ``"stale"`` or ``"fresh"`` with several steps an epoch: both hand a halo row's
            gradient to its owner chunk within or after the epoch, but with several optimizer steps an epoch the owner
            ran under other weights (GNNAutoScale's rule drops them: ``"detach"``, what ``"auto"`` chooses).
    """
    steps = datamodule.steps_per_epoch
    if steps > 1 and halo_gradients not in ("detach", HALO_AUTO):
        raise ValueError(
            f"{where}: `halo_gradients={halo_gradients!r}` needs one training step an epoch, but the DataModule runs "
            f"{steps} (got chunks_per_step={datamodule.chunks_per_step} of num_chunks={datamodule.num_chunks}). "
            "Use halo_gradients='detach' (or 'auto'), or chunks_per_step=None."
        )


def check_layout(
    module: nn.Module, datamodule: Optional[object], num_stages: int, schedule: str, fitting: bool = True,
    graph_parallel_size: int = 1, stages_per_rank: int = 1, world_size: Optional[int] = None,
    evaluation: str = "auto", halo_gradients: str = HALO_AUTO,
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
        world_size: ``P = S * G`` processes (default ``S * G``).
        evaluation: The strategy's ``evaluation`` (:func:`resolve_evaluation`).
        halo_gradients: The strategy's ``halo_gradients`` (:func:`check_steps`).

    Raises:
        TypeError: No ``GraphChunkDataModule``, or no splittable layer stack.
        ValueError: A process count that is not a multiple of ``G``, a DataModule whose ``num_parts`` is not
            ``G``, more (virtual) stages than layers, a multi-hop conv, a graph-wide norm layer (see
            :func:`~lightning_gnnpipe.nn.feature_norm.check_feature_norms`), a schedule that cannot run with
            the given ``K``, ``S`` and ``v`` (:func:`~lightning_gnnpipe.pipeline.schedule.check_schedule`), or a
            multi-stage schedule with ``G > 1``, or ``evaluation="graph_parallel"`` with ``K < S``, or
            ``halo_gradients`` ``"stale"``/``"fresh"`` with several steps an epoch (:func:`check_steps`); the
            schedule's rule is checked on the chunks of one step (``chunks_per_step / G``). Whether the loss
            can drive a schedule other than GPipe is decided at setup
            (:mod:`~lightning_gnnpipe.strategy.schedule_choice`).
    """
    G, world = graph_parallel_size, world_size if world_size is not None else num_stages * graph_parallel_size
    if world % G:
        raise ValueError(
            f"GNNPipeStrategy: the {world} processes cannot form `graph_parallel_size`={G} pipelines "
            f"(got devices * num_nodes = {world}). Use a process count that is a multiple of {G}."
        )
    parts = getattr(datamodule, "num_parts", 1)
    if isinstance(datamodule, GraphChunkDataModule) and parts != G and datamodule.partitions is not None:
        raise ValueError(
            f"GNNPipeStrategy: `graph_parallel_size`={G} needs the graph cut into {G} partitions, but "
            f"{datamodule.partitions.path} holds num_parts={parts}. Partition it again with "
            f"`lightning-gnnpipe partition --num-parts {G}`, or use graph_parallel_size={parts}."
        )
    if isinstance(datamodule, GraphChunkDataModule) and parts != G:
        raise ValueError(
            f"GNNPipeStrategy: `graph_parallel_size`={G} needs the graph cut into {G} partitions, but the "
            f"DataModule has num_parts={parts}. Build it as GraphChunkDataModule(data, num_chunks=K, "
            f"num_parts={G})."
        )
    if not isinstance(datamodule, GraphChunkDataModule):
        raise TypeError(
            "GNNPipeStrategy: pass the graph as `datamodule=GraphChunkDataModule(data, num_chunks=K)` "
            f"(got datamodule={type(datamodule).__name__}). The strategy needs its chunk plan."
        )
    resolve_evaluation(evaluation, G, datamodule.num_chunks, num_stages)
    check_steps(datamodule, halo_gradients)
    stack = find_layer_stack(module)
    check_one_hop(stack.blocks)
    check_feature_norms(stack.blocks)
    check_schedule(schedule, stages_per_rank=stages_per_rank)
    check_not_multi_stage_hybrid(schedule, graph_parallel_size)
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
        try:
            check_schedule(schedule, datamodule.chunks_per_step // graph_parallel_size, num_stages, stages_per_rank)
        except ValueError as err:
            if datamodule.steps_per_epoch == 1:
                raise
            raise ValueError(f"{err} With several steps an epoch the schedule's micro-batches are one step's chunks: "
                             f"chunks_per_step={datamodule.chunks_per_step} (of num_chunks={datamodule.num_chunks})"
                             f"{f' / graph_parallel_size={graph_parallel_size}' if graph_parallel_size > 1 else ''}; "
                             "raise chunks_per_step.") from None
    return stack


def check_lightning_usage(trainer: Any, module: nn.Module, stack: LayerStack, where: str) -> None:
    """Refuse, before any process starts, what would train differently from one device.

    Args:
        trainer: The ``Trainer`` (``accumulate_grad_batches``).
        module: The LightningModule.
        stack: Its layer stack.
        where: The strategy's name, for the message.

    Raises:
        ValueError: Trainable parameters outside the layer stack (a head, an encoder, a temperature): the
            strategies backpropagate into the stack's blocks only, so those would get no gradient; manual
            optimization (``automatic_optimization = False``): the step's backward runs inside the strategy, not in
            ``manual_backward``; ``accumulate_grad_batches > 1``: one step already holds the whole graph, and
            Lightning would scale a loss that the strategy does not backpropagate.
    """
    inside = {id(p) for b in stack.blocks for p in b.parameters()}
    outside = [name for name, p in module.named_parameters() if p.requires_grad and id(p) not in inside]
    if outside:
        shown = ", ".join(outside[:5]) + (f", ... ({len(outside)} in all)" if len(outside) > 5 else "")
        raise ValueError(
            f"{where}: the module has trainable parameters outside the layer stack (got {shown}). The strategy "
            "backpropagates through the stack's blocks only, so they would not train as on one device. Make them part "
            "of a block: declare `pipeline_blocks()` with the head or encoder as a node-wise block (see "
            "docs/custom_models.md), or freeze them (`requires_grad_(False)`)."
        )
    if not getattr(module, "automatic_optimization", True):
        raise ValueError(
            f"{where}: manual optimization is not supported (got automatic_optimization=False on "
            f"{type(module).__name__}). The strategy runs the backward pass itself; return the loss from "
            "`training_step` and let Lightning step the optimizer."
        )
    accumulate = getattr(trainer, "accumulate_grad_batches", 1)
    if accumulate != 1:
        raise ValueError(
            f"{where}: `accumulate_grad_batches` must be 1 (got {accumulate}). One training step is the whole "
            "graph (gradients are already accumulated over all chunks); use Trainer(accumulate_grad_batches=1)."
        )
