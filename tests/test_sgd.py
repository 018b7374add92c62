"""Plain-SGD parameter comparisons for the cases ``test_exactness.py::test_sgd_parameters_equal_the_reference``
does not cover: the multi-stage schedules, hybrid parallelism, moving-average history tables, stale and fresh halo
gradients.

Adam divides every step by the gradient's running scale, so a gradient that is wrong by a constant factor (one
stage's gradients doubled, say) trains almost exactly like the right one and a loss comparison misses it. Plain SGD
(no momentum, no clipping) moves each parameter by ``lr`` times its gradient: after a few steps the parameters
equal those of the independent single-process reference (``tests/reference.py``) only if every gradient was right.
Each test also asserts that every parameter moved in the reference (a parameter that does not train cannot show
a wrong step) and, where an option changes training, that the option's reference differs from the reference
without it by far more than the tolerance (the test can tell the option from its absence).
"""

import sys
from pathlib import Path
from typing import Dict

import pytest
import torch

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule
from lightning_gnnpipe.pipeline.schedule import MULTI_STAGE_SCHEDULES
from tests.helpers import MetricRecorder, fit, read_metrics, sbm_graph, schedule_params
from tests.reference import chunked_reference, layer_major_reference
from tests.test_exactness import SaveWeights, SGDChunkLossGCN, _trained

EPOCHS = 4
MODEL = (16, 32, 4, 4)  # in, hidden, 4 GCN layers (one per stage with 2 ranks x 2 stages), classes
LR = 0.5
ATOL = 1e-6  # the largest error seen is 3e-8 (float32 summation order)
MOVED = 1e-3  # every parameter moves more than this in the reference
DISTINCT = 1e-4  # an option's reference differs from the one without it by more than this (100 x ATOL)

State = Dict[str, torch.Tensor]


@pytest.fixture(scope="module")
def graph():
    return sbm_graph(num_nodes=300)


def reference_weights(graph, plan, **options) -> State:
    """Parameters after ``EPOCHS`` SGD steps of :func:`chunked_reference` with ``options``."""
    module = SGDChunkLossGCN(*MODEL, lr=LR)
    chunked_reference(module, graph, plan, EPOCHS, **options)
    return module.state_dict()


def trained_weights(directory: Path, dm, devices: int, strategy, validate: bool = False) -> State:
    """Parameters after ``EPOCHS`` SGD steps with ``strategy`` on ``devices`` forked ranks (collective checkpoint);
    with ``validate`` a validation after every epoch."""
    fit(str(directory), SGDChunkLossGCN(*MODEL, lr=LR), dm, devices=devices, strategy=strategy, epochs=EPOCHS,
        limit_val_batches=1 if validate else 0,
        callbacks=[MetricRecorder(str(directory)), SaveWeights(directory / "weights.ckpt")])
    return _trained(directory / "weights.ckpt")


def largest_difference(a: State, b: State) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def assert_equal_to_reference(trained: State, expected: State) -> None:
    """``trained`` equals ``expected`` within ``ATOL``, every parameter of ``expected`` having moved > ``MOVED``."""
    start = SGDChunkLossGCN(*MODEL, lr=LR).state_dict()
    moved = {k: float((v - start[k]).abs().max()) for k, v in expected.items()}
    assert min(moved.values()) > MOVED, f"parameters that barely train in the reference: {moved}"
    assert set(trained) == set(expected)
    errors = {k: float((trained[k] - v).abs().max()) for k, v in expected.items()}
    assert max(errors.values()) <= ATOL, f"largest |trained - reference| per parameter: {errors}"


@pytest.mark.parametrize("schedule", schedule_params(sorted(MULTI_STAGE_SCHEDULES)))
def test_multi_stage_schedules_sgd_parameters_equal_the_reference(tmp_path, graph, schedule):
    """2 ranks x 2 stages per rank (4 one-layer stages; zbv: the last on rank 0), K = 4: the chunked reference."""
    dm = GraphChunkDataModule(graph, num_chunks=4)
    expected = reference_weights(graph, dm.plan)
    trained = trained_weights(tmp_path, dm, 2, GNNPipeStrategy(schedule=schedule, stages_per_rank=2))
    assert_equal_to_reference(trained, expected)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_hybrid_sgd_parameters_equal_the_reference(tmp_path, graph, schedule):
    """2 stages x 2 partitions (4 ranks), K = 8: the hybrid rule (a slot's chunks read each other live)."""
    dm = GraphChunkDataModule(graph, num_chunks=8, num_parts=2)
    expected = reference_weights(graph, dm.plan, num_parts=2)
    assert largest_difference(expected, reference_weights(graph, dm.plan)) > DISTINCT  # not the pipeline rule
    trained = trained_weights(tmp_path, dm, 4, GNNPipeStrategy(graph_parallel_size=2, schedule=schedule))
    assert_equal_to_reference(trained, expected)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_history_momentum_sgd_parameters_equal_the_reference(tmp_path, graph, schedule):
    """Tables written as ``m * old + (1 - m) * new`` with m = 0.9 (0.5 would not tell m from 1 - m)."""
    m = 0.9
    dm = GraphChunkDataModule(graph, num_chunks=4)
    expected = reference_weights(graph, dm.plan, momentum=m)
    for other in (0.0, 1 - m):
        assert largest_difference(expected, reference_weights(graph, dm.plan, momentum=other)) > DISTINCT, other
    trained = trained_weights(tmp_path, dm, 2, GNNPipeStrategy(schedule=schedule, history_momentum=m))
    assert_equal_to_reference(trained, expected)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_stale_halo_gradients_sgd_parameters_equal_the_reference(tmp_path, graph, schedule):
    """``halo_gradients="stale"``: the gradient reaching halo rows in epoch e is added to the owners' in e + 1."""
    dm = GraphChunkDataModule(graph, num_chunks=4)
    expected = reference_weights(graph, dm.plan, stale_halo_grads=True)
    assert largest_difference(expected, reference_weights(graph, dm.plan)) > DISTINCT  # not the detached halos
    trained = trained_weights(tmp_path, dm, 2, GNNPipeStrategy(schedule=schedule, halo_gradients="stale"))
    assert_equal_to_reference(trained, expected)


@pytest.mark.parametrize("schedule,refresh_every", [("gpipe", 0), ("1f1b", 0), ("1f1b", 1)])
def test_fresh_halo_gradients_sgd_parameters_equal_the_reference(tmp_path, graph, schedule, refresh_every):
    """``halo_gradients="fresh"``: the gradient that reaches rows a chunk read historical is added to the owners' in
    the same epoch (their backward comes later); the layer-by-layer reference, which shares no code with
    :func:`chunked_reference` (itself checked equal to it for detached halos)."""
    dm = GraphChunkDataModule(graph, num_chunks=4)

    def layer_major(**options) -> State:
        module = SGDChunkLossGCN(*MODEL, lr=LR)
        layer_major_reference(module, graph, dm.plan, EPOCHS, refresh_every=refresh_every, **options)
        return module.state_dict()

    expected = layer_major(halo_gradients="fresh")
    assert largest_difference(layer_major(), reference_weights(graph, dm.plan, refresh_every=refresh_every)) <= ATOL
    assert largest_difference(expected, layer_major()) > DISTINCT  # not the detached halos
    stale = reference_weights(graph, dm.plan, refresh_every=refresh_every, stale_halo_grads=True)
    assert largest_difference(expected, stale) > DISTINCT  # nor the stale ones
    trained = trained_weights(tmp_path, dm, 2, GNNPipeStrategy(schedule=schedule, halo_gradients="fresh",
                                                               refresh_every=refresh_every))
    assert_equal_to_reference(trained, expected)
    logged = [(m["gnnpipe/stale_edge_fraction"], m["gnnpipe/stale_age_epochs"]) for m in read_metrics(tmp_path)]
    assert logged == [pytest.approx(dm.stale_read_stats(reverse=e % 2 == 1, alternating=True)) for e in range(EPOCHS)]
    assert logged[0] != pytest.approx(logged[1])  # the order alternates, and with it the rows read historical
    if refresh_every:  # the validations that are the refreshes train the same
        validated = trained_weights(tmp_path / "validated", dm, 2, GNNPipeStrategy(
            schedule=schedule, halo_gradients="fresh", refresh_every=refresh_every), validate=True)
        assert_equal_to_reference(validated, expected)


@pytest.mark.parametrize("schedule,G", [("gpipe", 1), ("1f1b", 1), ("1f1b", 2)])
def test_bfloat16_history_tables_sgd_parameters_equal_the_reference(tmp_path, graph, schedule, G, monkeypatch):
    """``history_dtype="bfloat16"``: every row of a layer >= 1 table is kept rounded to bfloat16 (fresh and
    historical; a chunk's own rows, layer 0's feature rows and, in hybrid parallelism, the rows received from the
    other partitions stay float32), and the tables take half the bytes.

    Two steps, not four: from the third on, the float32 differences of the summation order (3e-8) start to tip
    single bfloat16 roundings the other way (one ulp, 2^-8 relative), and one tipped row moves the parameters by
    about 1e-4, as much as the rounding itself."""
    dm = GraphChunkDataModule(graph, num_chunks=4 * G, num_parts=G)
    monkeypatch.setattr(sys.modules[__name__], "EPOCHS", 2)
    expected = reference_weights(graph, dm.plan, num_parts=G, table_dtype=torch.bfloat16)
    assert largest_difference(expected, reference_weights(graph, dm.plan, num_parts=G)) > DISTINCT  # not float32
    trained = trained_weights(tmp_path, dm, 2 * G, GNNPipeStrategy(schedule=schedule, history_dtype="bfloat16",
                                                                   graph_parallel_size=G))
    assert_equal_to_reference(trained, expected)
    if G == 1:  # tables of the boundary nodes only (87% of this graph's), plus the row map (int64 ids and rows)
        n, d, rows = graph.num_nodes, MODEL[1], torch.cat(dm.plan.halo).unique().numel()
        assert rows < 0.9 * n
        kept = [read_metrics(str(tmp_path), r)[-1][f"memory/history_bytes/rank{r}"] for r in range(2)]
        row_map = rows * 8 + n * 8
        assert kept == [1 * rows * d * 2 + row_map, 2 * rows * d * 2 + row_map]  # stage 0: layer 1; 1: layers 2, 3
