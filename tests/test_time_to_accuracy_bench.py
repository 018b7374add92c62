"""The time-to-accuracy benchmark's own parts: its graph has community structure and labels that need neighbours,
and its emulated link cleans up after itself. (The benchmark itself is not a test.)"""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from benchmarks.time_to_accuracy.graph import GraphSpec, community_graph
from benchmarks.time_to_accuracy.link import LinkUnavailable, namespaces, shaped_loopback, shaping_args
from lightning_gnnpipe import GraphChunkDataModule


def test_community_graph_statistics():
    spec = GraphSpec(num_nodes=40_000, seed=3)
    data = community_graph(spec)
    n, e = data.num_nodes, data.edge_index.size(1)
    assert 0.9 * n * spec.avg_degree <= e <= n * spec.avg_degree  # both directions, duplicates and loops dropped
    src, dst = data.edge_index
    assert bool((src != dst).all())
    assert torch.equal(torch.sort(src * n + dst).values, torch.sort(dst * n + src).values)  # symmetric
    assert torch.equal(community_graph(spec).edge_index, data.edge_index)  # deterministic
    inside = (data.community[src] == data.community[dst]).float().mean()
    assert 0.6 < float(inside) < 0.8  # p_in = 0.72 of the drawn edges
    dm = GraphChunkDataModule(data, num_chunks=8)
    assert 0.1 <= dm.plan.edge_cut <= 0.3  # METIS cuts as in real graphs, not as in a uniform SBM
    boundary = torch.cat(dm.plan.halo).unique().numel() / n
    assert boundary < 0.5  # long-range edges gather on the connectors
    same = (data.y[src] == data.y[dst]).float().mean()  # homophily: neighbours mostly share the class
    assert float(same) > 0.5
    assert [int(m.sum()) for m in (data.train_mask, data.val_mask, data.test_mask)] == [12_000, 8_000, 20_000]
    with pytest.raises(ValueError, match="community_size"):
        community_graph(GraphSpec(num_nodes=10, community_size=20))


def test_shaping_arguments():
    assert shaping_args(200e6) == ["tbf", "rate", "200000000bit", "burst", "262144", "limit", "2500000"]
    assert shaping_args(8e9)[3:] == ["burst", "10000000", "limit", "100000000"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
                    reason="needs root and iproute2")
def test_shaped_loopback_is_removed_after_use_and_after_an_error():
    before = set(namespaces())
    with shaped_loopback(100e6, name="gnnpipe-tta-test") as prefix:
        assert "gnnpipe-tta-test" in namespaces()
        shown = subprocess.run(prefix + ["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout
        assert "tbf" in shown and "100Mbit" in shown
        up = subprocess.run(prefix + ["ip", "link", "show", "lo"], capture_output=True, text=True).stdout
        assert "UP" in up
    assert set(namespaces()) == before
    with pytest.raises(RuntimeError, match="boom"):
        with shaped_loopback(None, name="gnnpipe-tta-test"):
            raise RuntimeError("boom")
    assert set(namespaces()) == before
    with pytest.raises(LinkUnavailable, match="ip netns add"):
        with shaped_loopback(None, name="bad/name"):
            pass


SAMPLER_CHECK = """
import sys, torch
from benchmarks.harness.memory import MemorySampler
sampler = MemorySampler(sys.argv[1], full_every=3600.0)
sampler.sample()
assert sampler._due()  # the first read is a high
assert not sampler._due()  # grew less than its slack (4 MiB), the last full sample is recent: no full sample
before = sampler.peak["uss"]
block = torch.ones(64 * 2**20 // 4)  # 64 MiB of private pages, touched
assert sampler._due()
sampler.sample()
assert sampler.peak["uss"] - before >= 48 * 2**20
"""


def test_memory_sampler_takes_a_full_sample_at_a_new_high_of_private_memory(tmp_path):
    """In a fresh process: a long-lived one (the test session) may hand the block pages it already holds."""
    from benchmarks.harness.memory import rss_anon_bytes

    if rss_anon_bytes() is None:
        pytest.skip("no /proc/self/status here")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", SAMPLER_CHECK, str(tmp_path / "mem.json")], cwd=root,
                          env={**os.environ, "PYTHONPATH": root}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_pair_lines_pair_each_exact_run_with_the_gnnpipe_run_after_it():
    from benchmarks.time_to_accuracy.pairs import pair_lines

    def rec(mode, train, val, uss_gib):
        return {"status": "ok", "batch": "b1", "spec": {"graph": {"num_nodes": 300_000}, "model": "ressage8",
                                                        "mode": mode},
                "epochs": [{"train_s": 99.0, "val_s": 99.0}, {"train_s": train, "val_s": val}],
                "processes": {"main": {"uss": uss_gib * 2**30}}}

    failed = {**rec("exact", 1.0, 1.0, 1.0), "status": "oom"}
    records = [rec("exact", 8.0, 2.0, 3.0), rec("gnnpipe", 5.0, 1.0, 1.5),  # pair 1: 6 / 10
               failed, rec("gnnpipe", 70.0, 70.0, 9.0),  # its exact run failed: not a pair
               rec("exact", 9.0, 1.0, 2.5), rec("gnnpipe", 4.0, 3.0, 1.0),  # pair 2: 7 / 10
               rec("exact", 50.0, 50.0, 9.0)]  # no GNNPipe run after it: not a pair
    variant = rec("gnnpipe", 3.0, 1.0, 2.0)
    variant["spec"]["strategy"] = {"heap_mmap_threshold": 33554432}
    records.insert(2, variant)  # after pair 1: compared with pair 1's exact run (10 s): 0.40x
    spread = [rec("exact", 10.0, 10.0, 5.0), rec("gnnpipe", 10.0, 5.0, 2.0)]  # another graph: a group of its own
    for r in spread:
        r["spec"]["graph"]["connectors"] = 1.0
    lines = pair_lines(records + spread, {(300_000, "ressage8"): [(0, 30, 30), (1, 28, 30)]},
                       {(300_000, "ressage8"): [(0, 25, 28)]})  # the spread graph's accuracy runs: its own epochs
    assert len(lines) == 5
    # medians: exact 8.5 + 1.5 = 10 (unpaired run left out), GNNPipe 4.5 + 2.0 = 6.5; second epochs only
    assert lines[2] == ("| b1 | page | 300,000 | ressage8 | 2 | 8.0-9.0 + 1.0-2.0 | 4.0-5.0 + 1.0-3.0 | 0.65x; "
                        "0.60x-0.70x | seed 0: 0.65x (30, 30); seed 1: 0.61x (28, 30) | 1.50 (3.00) GiB |")
    assert lines[3] == ("| b1 | page | 300,000 | ressage8, `heap_mmap_threshold=33554432` | 1 | 8.0-8.0 + 2.0-2.0 "
                        "| 3.0-3.0 + 1.0-1.0 | 0.40x; 0.40x-0.40x | – | 2.00 (3.00) GiB |")
    assert lines[4] == ("| b1 | spread | 300,000 | ressage8 | 1 | 10.0-10.0 + 10.0-10.0 | 10.0-10.0 + 5.0-5.0 | "
                        "0.75x; 0.75x-0.75x | seed 0: 0.67x (25, 28) | 2.00 (5.00) GiB |")
