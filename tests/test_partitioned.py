"""Partitioned graphs: ``partition_graph`` / ``lightning-gnnpipe partition`` write a directory, each rank loads only its
partition (``GraphChunkDataModule.from_partitions``), and the fit takes the same steps as from the graph in memory.

References: the round trip against brute-force sets from the whole graph; GCN's normalisation from saved degrees
against PyG's ``gcn_norm`` on the whole graph (``torch.equal``); the fits against the in-memory fit of the same plan
under plain SGD (parameters ``torch.equal``, after validations that refresh the history tables).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from lightning_gnnpipe import GNNPipeStrategy, GraphChunkDataModule, GraphParallelStrategy
from lightning_gnnpipe.cli import main as cli_main
from lightning_gnnpipe.data.chunk_graph import full_graph_norm
from lightning_gnnpipe.data.node_rows import NodeRows, select_rows_into
from lightning_gnnpipe.data.partitioned import load_partition, load_plan, partition_graph, read_meta
from lightning_gnnpipe.data.partitioned.layout import part_features, part_graph
from tests.helpers import sbm_graph
from tests.test_sgd import largest_difference, trained_weights
from tests.world import free_port

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def graph():
    g = sbm_graph(num_nodes=300)
    extra = torch.tensor([[5, 7, 7, 11], [5, 9, 9, 11]])  # two self loops and a duplicate edge
    g.edge_index = torch.cat([g.edge_index, extra], 1)
    return g


@pytest.fixture(scope="module")
def parts(tmp_path_factory, graph):
    """The graph cut into G = 2 partitions of 2 chunks each (the hybrid 2 x 2's directory)."""
    out = tmp_path_factory.mktemp("parts") / "g2k4"
    partition_graph(graph, 2, 4, str(out), verbose=False)
    return out


@pytest.mark.parametrize("key", [(False, True), (True, True), (False, False)])
def test_norm_from_saved_degrees_equals_gcn_norm(graph, key):
    ei, n = graph.edge_index, graph.num_nodes
    ref_ei, ref_w = gcn_norm(ei, None, n, key[0], key[1], "source_to_target", torch.float32)
    dst = ei[1]
    with_loops = torch.bincount(dst, minlength=n)
    degrees = (with_loops - torch.bincount(dst[ei[0] == dst], minlength=n), with_loops)
    got_ei, got_w = full_graph_norm(ei, n, key, torch.float32, degrees)
    assert torch.equal(got_ei, ref_ei) and torch.equal(got_w, ref_w)
    # one partition's edges and loops: exactly gcn_norm's entries for those edges, in gcn_norm's order
    owned = torch.arange(0, n, 3)
    into = torch.isin(ref_ei[1], owned)
    sub = ei[:, torch.isin(dst, owned)]
    got_ei, got_w = full_graph_norm(sub, n, key, torch.float32, degrees, loop_nodes=owned)
    assert torch.equal(got_ei, ref_ei[:, into]) and torch.equal(got_w, ref_w[into])
    wrong = (degrees[0] + 1, degrees[1] + 1)  # the test can fail: a partition's own in-degrees differ
    assert not torch.equal(full_graph_norm(ei, n, key, torch.float32, wrong)[1], ref_w)


def test_round_trip(graph, parts):
    meta = read_meta(str(parts))
    dm = GraphChunkDataModule(graph, num_chunks=4, num_parts=2)
    plan, counts = load_plan(meta)
    assert plan.fingerprint() == dm.plan.fingerprint() and plan.edge_cut == dm.plan.edge_cut
    assert all(torch.equal(a, b) for a, b in zip(plan.nodes, dm.plan.nodes))
    assert all(torch.equal(a, b) for a, b in zip(plan.halo, dm.plan.halo))
    owner = plan.part % 2
    src, dst = graph.edge_index
    assert int(counts.sum()) == graph.edge_index.size(1)
    for g in range(2):
        data = load_partition(meta, g)
        into = owner[dst] == g
        assert torch.equal(data.edge_index, graph.edge_index[:, into])  # its edges, in the graph's order
        own = (owner == g).nonzero().view(-1)
        ids = torch.cat([own, src[into]]).unique()
        assert isinstance(data.x, NodeRows) and torch.equal(data.x.ids, ids)
        assert torch.equal(data.x[ids], graph.x[ids]) and data.x.shape == graph.x.shape
        out = torch.empty(own.numel(), graph.x.size(1))
        select_rows_into(data.x, own, out)
        assert torch.equal(out, graph.x[own])
        outside = (~torch.isin(torch.arange(graph.num_nodes), ids)).nonzero().view(-1)
        assert outside.numel() > 0 and bool((owner[outside] != g).all())  # another partition's, not in the halo
        with pytest.raises(IndexError, match=f"node {int(outside[0])} is not among the {ids.numel()} nodes"):
            data.x[outside[:1]]
        for name in ("y", "train_mask", "val_mask", "test_mask"):
            assert torch.equal(data[name], graph[name])
        assert meta.meta["parts"][g] == {"nodes": own.numel(), "halo": ids.numel() - own.numel(),
                                         "edges": int(into.sum())}
        stub = load_partition(meta, g, features=False)
        assert stub.x.values.size(0) == 2 and torch.equal(stub.x.values, graph.x[ids[:2]])


def _fit_both(tmp_path, graph, strategy, devices, num_parts, num_chunks, part=None, **steps):
    dm = GraphChunkDataModule(graph, num_chunks=num_chunks, num_parts=1 if part is not None else num_parts, part=part,
                              **steps)
    out = tmp_path / "parts"
    partition_graph(graph, num_parts, num_chunks, str(out), part=part, verbose=False)
    memory = trained_weights(tmp_path / "memory", dm, devices, strategy(), validate=True)
    disk = trained_weights(tmp_path / "disk", GraphChunkDataModule.from_partitions(str(out), **steps), devices,
                           strategy(), validate=True)
    return memory, disk


@pytest.mark.parametrize("case", ["hybrid_1f1b", "hybrid_steps", "pipeline_gpipe", "pipeline_1f1b",
                                  "graph_parallel"])
def test_fit_from_partitions_takes_the_same_steps(tmp_path, graph, case):
    """Plain SGD, validation (and with it the history refresh) every epoch: the parameters equal the in-memory
    fit's bit for bit (hybrid 2 x 2 with 1F1B and with two steps an epoch, GNNPipe with one partition and GPipe or
    1F1B, graph parallelism G = 2)."""
    if case == "hybrid_1f1b":
        memory, disk = _fit_both(tmp_path, graph, lambda: GNNPipeStrategy(graph_parallel_size=2, schedule="1f1b"),
                                 4, 2, 4)
    elif case == "hybrid_steps":  # two optimizer steps an epoch, shuffled groups of 2 chunks
        memory, disk = _fit_both(tmp_path, graph, lambda: GNNPipeStrategy(graph_parallel_size=2), 4, 2, 4,
                                 chunks_per_step=2, chunk_groups="shuffle")
    elif case.startswith("pipeline"):
        memory, disk = _fit_both(tmp_path, graph, lambda: GNNPipeStrategy(schedule=case.split("_")[1]), 2, 1, 4)
    else:
        part = GraphChunkDataModule(graph, num_chunks=2).plan.part
        memory, disk = _fit_both(tmp_path, graph, GraphParallelStrategy, 2, 2, 2, part=part)
    assert all(torch.equal(memory[k], disk[k]) for k in memory), largest_difference(memory, disk)


def test_hybrid_gpipe_from_partitions_equals_memory(tmp_path, graph):
    memory, disk = _fit_both(tmp_path, graph, lambda: GNNPipeStrategy(graph_parallel_size=2, schedule="gpipe",
                                                                      refresh_every=0), 4, 2, 4)
    assert all(torch.equal(memory[k], disk[k]) for k in memory), largest_difference(memory, disk)


# ---------------------------------------------------------------- the command line
def test_cli_partition_writes_what_partition_graph_writes(tmp_path, graph):
    path = tmp_path / "graph.pt"
    torch.save(graph, path)
    cli_main(["partition", "--data", str(path), "--num-parts", "2", "--num-chunks", "4", "--out",
              str(tmp_path / "cli")])
    partition_graph(graph, 2, 4, str(tmp_path / "api"), verbose=False)
    a, b = (json.loads((tmp_path / d / "META.json").read_text()) for d in ("cli", "api"))
    assert {k: r["sha256"] for k, r in a["files"].items()} == {k: r["sha256"] for k, r in b["files"].items()}
    assert a["peak_bytes"] > 0 and set(a["seconds"]) >= {"metis_and_plan", "part_0", "part_1", "checksums"}


def test_cli_dataset_is_never_downloaded(tmp_path):
    with pytest.raises(FileNotFoundError, match="never downloaded"):
        cli_main(["partition", "--dataset", "torch_geometric.datasets.Planetoid", "--root", str(tmp_path / "none"),
                  "--name", "Cora", "--num-parts", "1", "--num-chunks", "2", "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- bad input
def _copy(parts, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(parts, out)
    return out


def test_an_existing_directory_is_not_written_over(tmp_path, graph):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="nothing is written over"):
        partition_graph(graph, 2, 4, str(tmp_path / "out"), verbose=False)
    assert os.listdir(tmp_path / "out") == ["keep.txt"]


def test_an_interrupted_partitioner_leaves_nothing_that_loads(tmp_path, graph, monkeypatch):
    import lightning_gnnpipe.data.partitioned.write as write

    def fail(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(write, "sha256", fail)  # interrupted at the last phase, after every part is written
    with pytest.raises(KeyboardInterrupt):
        partition_graph(graph, 2, 4, str(tmp_path / "out"), verbose=False)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("damage,error,match", [
    ("no_meta", FileNotFoundError, "no META.json"),
    ("missing_plan", FileNotFoundError, "plan.pt is missing"),
    ("truncated", ValueError, "part_0/node_feats.pt has .* bytes, META.json records"),
    ("version", ValueError, "format version 99"),
])
def test_damaged_directories_fail_before_any_process(tmp_path, parts, damage, error, match):
    out = _copy(parts, tmp_path)
    if damage == "no_meta":
        (out / "META.json").unlink()
    elif damage == "missing_plan":
        (out / "plan.pt").unlink()
    elif damage == "truncated":
        path = out / part_features(0)
        path.write_bytes(path.read_bytes()[:-100])
    else:
        meta = json.loads((out / "META.json").read_text())
        meta["version"] = 99
        (out / "META.json").write_text(json.dumps(meta))
    with pytest.raises(error, match=match):
        GraphChunkDataModule.from_partitions(str(out))


def test_a_changed_file_fails_its_checksum_where_it_is_loaded(tmp_path, parts):
    out = _copy(parts, tmp_path)
    path = out / part_graph(0)
    raw = bytearray(path.read_bytes())
    raw[-40] ^= 0xFF  # same size, other bytes
    path.write_bytes(bytes(raw))
    meta = read_meta(str(out))  # sizes agree: the directory opens ...
    with pytest.raises(ValueError, match="part_0/graph.pt has sha256"):
        load_partition(meta, 0)  # ... and the rank that reads the file stops with its name
    load_partition(meta, 1)


def test_another_num_parts_is_refused_before_training(tmp_path, parts):
    from lightning.pytorch import Trainer

    from tests.helpers import GCNModule

    dm = GraphChunkDataModule.from_partitions(str(parts))
    trainer = Trainer(accelerator="cpu", devices=1, strategy=GNNPipeStrategy(), logger=False)
    with pytest.raises(ValueError, match=r"graph_parallel_size`=1 needs .* holds num_parts=2.*--num-parts 1"):
        trainer.strategy.check(trainer, module=GCNModule(16, 32, 4, 4), datamodule=dm)
    with pytest.raises(ValueError, match="each of the 4 processes loads one partition.*num_parts=2"):
        _gp_check(parts)


def _gp_check(parts):
    from lightning.pytorch import Trainer

    from tests.helpers import GCNModule

    dm = GraphChunkDataModule.from_partitions(str(parts))
    trainer = Trainer(accelerator="cpu", devices=4, strategy=GraphParallelStrategy(), logger=False)
    dm.num_chunks = 4  # as a K = 4 directory of 2 partitions would be: the partition count is what is refused
    trainer.strategy.check(trainer, module=GCNModule(16, 32, 4, 4), datamodule=dm)


def test_without_a_lightning_gnnpipe_strategy_the_datamodule_says_why(parts):
    from lightning.pytorch import Trainer

    from tests.helpers import GCNModule

    dm = GraphChunkDataModule.from_partitions(str(parts))
    with pytest.raises(TypeError, match="each rank loads one partition, which only lightning_gnnpipe's"):
        Trainer(accelerator="cpu", devices=1, logger=False, max_epochs=1).fit(GCNModule(16, 32, 4, 4), dm)


def test_a_rank_that_cannot_read_its_part_ends_the_job(tmp_path, parts):
    """Partition 1's features go missing after the launch checked the directory: rank 1's setup names the file and
    every rank ends (the others wait at the next collective until the failure timeout)."""
    from datetime import timedelta

    from tests.helpers import GCNModule
    from tests.world import run_world

    out = _copy(parts, tmp_path)
    dm = GraphChunkDataModule.from_partitions(str(out))
    (out / part_features(1)).unlink()
    strategy = GNNPipeStrategy(graph_parallel_size=2, timeout=timedelta(seconds=30))
    results = run_world(2, _fit_one, str(tmp_path), GCNModule(16, 32, 2, 4), dm, strategy, timeout=120.0)
    assert all(r.exitcode is not None and r.exitcode != 0 for r in results)
    assert any("part_1/node_feats.pt is missing" in (r.error or "") for r in results)


def _fit_one(directory, module, dm, strategy):
    from lightning.pytorch import Trainer

    Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=1, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False).fit(module, dm)


# ---------------------------------------------------------------- torchrun, two "nodes"
def test_torchrun_two_nodes_from_partitions(tmp_path, graph, parts):
    """Two torchrun agents (``--nnodes 2 --node-rank r``, one process each) train the hybrid 1 x 2 from the
    directory; the weights equal the in-memory fit's."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank",
         str(r), "--master-addr", "127.0.0.1", "--master-port", str(port), str(ROOT / "tests" / "partitioned_job.py"),
         str(parts), str(tmp_path / "torchrun")], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(2)]
    logs = [a.communicate(timeout=240)[0] for a in agents]
    assert all(a.returncode == 0 for a in agents), logs[0][-3000:] + logs[1][-3000:]
    from tests.partitioned_job import strategy

    memory = trained_weights(tmp_path / "memory", GraphChunkDataModule(graph, num_chunks=4, num_parts=2), 2,
                             strategy(), validate=True)
    disk = torch.load(tmp_path / "torchrun" / "weights.ckpt", weights_only=True)["state_dict"]
    assert all(torch.equal(memory[k], disk[k]) for k in memory), largest_difference(memory, disk)


def test_hybrid_with_a_node_wise_first_block_from_partitions_equals_memory(tmp_path, graph):
    """A residual GCN whose first block is a node-wise Linear: the exact evaluation of a partition applies it to the
    rows the rank holds (its partition and halo); the SGD parameters after validations equal the in-memory fit's."""
    from tests.helpers import GNNModule, ResGCN, MetricRecorder
    from tests.test_exactness import SaveWeights, _trained
    from tests.helpers import fit

    class SGDResGCN(GNNModule):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)

    dm = GraphChunkDataModule(graph, num_chunks=4, num_parts=2)
    partition_graph(graph, 2, 4, str(tmp_path / "parts"), verbose=False)
    weights = []
    for name, data in (("memory", dm), ("disk", GraphChunkDataModule.from_partitions(str(tmp_path / "parts")))):
        torch.manual_seed(0)
        module = SGDResGCN(ResGCN(16, 32, 2, 4))
        fit(str(tmp_path / name), module, data, devices=4, strategy=GNNPipeStrategy(graph_parallel_size=2),
            epochs=3, limit_val_batches=1, callbacks=[MetricRecorder(str(tmp_path / name)),
                                                     SaveWeights(tmp_path / name / "weights.ckpt")])
        weights.append(_trained(tmp_path / name / "weights.ckpt"))
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0]), largest_difference(*weights)


# ---------------------------------------------------------------- evaluation, predict, checkpoints and resume
def test_validate_and_predict_from_partitions_equal_the_plain_module(tmp_path, graph, parts):
    """Hybrid 2 x 2 from the directory: fit, then ``validate`` and ``predict`` from the checkpoint; the metrics and
    the logits equal the plain module's on the whole graph with the checkpoint's weights."""
    from tests.test_eval_modes import _plain, eval_job
    from tests.world import run_world, values

    dm = GraphChunkDataModule.from_partitions(str(parts))
    metrics = values(run_world(4, eval_job, dm, 4, GNNPipeStrategy, {"graph_parallel_size": 2}, str(tmp_path)))
    state = torch.load(tmp_path / "ckpt" / "epoch=0.ckpt", weights_only=True)
    out, expected = _plain(graph, state["state_dict"])
    for rank, got in enumerate(metrics):
        assert all(abs(got[name] - value) <= 1e-6 for name, value in expected.items()), (got, expected)
        torch.testing.assert_close(torch.load(tmp_path / f"logits.rank{rank}.pt"), out, atol=1e-5, rtol=0)


def test_resume_from_partitions_continues_the_in_memory_run(tmp_path, graph, parts):
    """A checkpoint (with history tables) of the in-memory hybrid fit resumes from the directory: the losses continue
    the uninterrupted in-memory run bit for bit."""
    from tests.scenarios import DropoutGCN, losses_job
    from tests.world import run_world, values

    opts = {"graph_parallel_size": 2, "save_history": True, "refresh_every": 0}
    ckpt = tmp_path / "ckpt"
    dm = GraphChunkDataModule(graph, num_chunks=4, num_parts=2)
    full = values(run_world(4, losses_job, DropoutGCN(16, 32, 4, 4), dm, 4, 5, ckpt_dir=str(ckpt),
                            strategy_kwargs=opts))[-1]
    resumed = values(run_world(4, losses_job, DropoutGCN(16, 32, 4, 4), GraphChunkDataModule.from_partitions(
        str(parts)), 4, 5, ckpt_path=str(ckpt / "epoch=1.ckpt"), strategy_kwargs=opts))[-1]
    assert len(full) == 5 and resumed == full[2:]


def test_cli_partitions_a_pyg_dataset_from_its_files(tmp_path):
    """``--dataset torch_geometric.datasets.Planetoid --name Cora`` from the repository's raw files (a copy, so that
    PyG's processing writes there): the directory loads, and its labels are Cora's."""
    shutil.copytree(ROOT / "datasets" / "Planetoid" / "Cora", tmp_path / "Cora")
    cli_main(["partition", "--dataset", "torch_geometric.datasets.Planetoid", "--root", str(tmp_path), "--name",
              "Cora", "--num-parts", "2", "--num-chunks", "4", "--out", str(tmp_path / "parts")])
    meta = read_meta(str(tmp_path / "parts"))
    assert meta.num_nodes == 2708 and meta.meta["num_edges"] == 10556 and meta.masks == ["train_mask", "val_mask",
                                                                                          "test_mask"]
    data = load_partition(meta, 1)
    assert int(data.y.max()) == 6 and int(data.train_mask.sum()) == 140


def test_spawned_ranks_load_their_partitions(tmp_path, graph, parts):
    """The strategy's own spawn launcher (a user's script on one machine): the launching process holds the directory's
    metadata only, the spawned ranks load their partitions, and the weights equal the in-memory fit's."""
    from tests.helpers import fit
    from tests.test_exactness import SGDChunkLossGCN

    dm = GraphChunkDataModule.from_partitions(str(parts))
    fit(str(tmp_path / "disk"), SGDChunkLossGCN(16, 32, 4, 4, lr=0.5), dm, devices=2,
        strategy=GNNPipeStrategy(graph_parallel_size=2), epochs=2, launcher="spawn", limit_val_batches=0,
        callbacks=_saver(tmp_path / "disk"))
    assert dm.data is None and dm.plan is None  # this process loaded nothing
    memory = GraphChunkDataModule(graph, num_chunks=4, num_parts=2)
    fit(str(tmp_path / "memory"), SGDChunkLossGCN(16, 32, 4, 4, lr=0.5), memory, devices=2,
        strategy=GNNPipeStrategy(graph_parallel_size=2), epochs=2, limit_val_batches=0,
        callbacks=_saver(tmp_path / "memory"))
    a, b = (torch.load(tmp_path / d / "weights.ckpt", weights_only=True)["state_dict"] for d in ("disk", "memory"))
    assert all(torch.equal(a[k], b[k]) for k in a), largest_difference(a, b)


def _saver(directory):
    from tests.helpers import MetricRecorder
    from tests.test_exactness import SaveWeights

    directory.mkdir(parents=True, exist_ok=True)
    return [MetricRecorder(str(directory)), SaveWeights(directory / "weights.ckpt")]


def test_a_machine_holds_only_its_own_part(tmp_path, graph, parts):
    """What the recipe says to place on a machine: ``META.json``, ``plan.pt``, ``labels.pt`` and its ranks'
    ``part_{g}/``. The directory opens (the launching process checks only the shared files) and the rank loads its
    partition; the other partition's files are needed only where they are read."""
    out = tmp_path / "machine1"
    out.mkdir()
    for name in ("META.json", "plan.pt", "labels.pt"):
        shutil.copy(parts / name, out / name)
    shutil.copytree(parts / "part_1", out / "part_1")
    meta = read_meta(str(out))
    assert torch.equal(load_partition(meta, 1).edge_index, load_partition(read_meta(str(parts)), 1).edge_index)
    with pytest.raises(FileNotFoundError, match="part_0/graph.pt is missing"):
        load_partition(meta, 0)
    dm = GraphChunkDataModule.from_partitions(str(out))
    assert (dm.num_features, dm.num_classes) == (16, 4) == (graph.num_features, int(graph.y.max()) + 1)


def test_out_with_a_trailing_slash(tmp_path, graph):
    partition_graph(graph, 2, 4, str(tmp_path / "parts") + "/", verbose=False)
    assert sorted(os.listdir(tmp_path)) == ["parts"] and read_meta(str(tmp_path / "parts")).num_parts == 2
