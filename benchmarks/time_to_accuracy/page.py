"""``docs/results/time_to_accuracy.md`` from the cached records of ``bench.py`` (nothing is measured here).

Derived figures, per (graph, model, seed):

* target: 99% of the exact single process's best validation accuracy over its epochs;
* epochs to it: the first epoch (counted from 1) whose validation accuracy reaches the target;
* seconds to it: the training and validation seconds of those epochs, as measured in the run;
* test accuracy at the run's best validation epoch (the first such epoch on ties);
* train / validation seconds per epoch: medians over the epochs after the first; bytes: sent by all ranks in one
  training step (median); peak memory of the largest process (RSS, and USS).

Under an emulated link the numerics do not change (the same processes compute the same values; only their transfers
are slower), so the time to accuracy at rate ``R`` is the free-link run's epochs to the target times the epoch
(training and validation) measured at ``R``.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

GIB = 2**30
MODES = ("exact", "gnnpipe", "gnnpipe_refresh_every0", "gnnpipe_halo_gradients", "gnnpipe_refresh_every1", "gnnpipe_refresh_every2",
         "graph_parallel", "hybrid", "mlp")
LABEL = {"exact": "exact, one process, CSR adjacency (2 threads)", "gnnpipe": "`GNNPipeStrategy()`, K = 8 (2 processes)",
         "gnnpipe_refresh_every0": "`GNNPipeStrategy(refresh_every=0)`, K = 8 (2 processes)",
         "gnnpipe_halo_gradients": "`GNNPipeStrategy(halo_gradients=\"stale\")`, K = 8 (2 processes)",
         "gnnpipe_refresh_every1": "`GNNPipeStrategy(refresh_every=1)`, K = 8 (2 processes)",
         "gnnpipe_refresh_every2": "`GNNPipeStrategy(refresh_every=2)`, K = 8 (2 processes)",
         "graph_parallel": "`GraphParallelStrategy()` (2 processes)",
         "hybrid": "hybrid 2 stages x 2 partitions, K = 8 (4 processes)", "mlp": "MLP, one process (no graph)"}
EXACT_FORWARD = {"refresh_every": 1, "halo_gradients": "fresh"}
"""GNNPipe's option for deep models: exact halo rows in the training forward, every cut edge's gradient every second
epoch (docs/convergence.md); the targets name it beside the defaults."""
LABEL["gnnpipe_halo_gradientsfresh_refresh_every1"] = ("`GNNPipeStrategy(refresh_every=1, halo_gradients=\"fresh\")` "
                                                       "(the defaults in these fits), K = 8 (2 processes)")
GRAPHS = {"page": "page's graph", "spread": "spread graph"}  # the spread graph: long-range edges on every node
LABEL_EXACT_FORWARD = "`GNNPipeStrategy(refresh_every=1, halo_gradients=\"fresh\")`"
SHORT = {"gnnpipe": "GNNPipe", "graph_parallel": "graph parallel", "hybrid": "hybrid 2x2"}


DEFAULT_HALO = (
    "**The defaults hand the halo rows' gradients to their owners.** `GNNPipeStrategy()` now means "
    "`refresh_every=\"auto\", halo_gradients=\"auto\"`: where the fit validates every epoch in full precision (as "
    "every run on this page does), each validation's exact forward also writes the history tables, so the next "
    "epoch's training forward reads exact halo rows at no forward of its own, and the gradients that reach halo rows "
    "go to their owner chunks in the same epoch (`\"fresh\"`: the chunks run in reverse order in odd epochs, so "
    "every cut edge's gradient arrives every second epoch; in a model without dropout, as here). That is "
    "`refresh_every=1, halo_gradients=\"fresh\"`, the "
    "options the accuracy runs labelled so named: they are the defaults' runs (the runs made since with "
    "`GNNPipeStrategy()` compute the same values: at 300k and 1M the first 2 epochs' validation accuracies agree "
    "to every digit). With them GCNII-16 ends 0.35 and 0.13 points below exact training at 300k (2 seeds), 0.46 at 1M "
    "and 0.23 on the spread graph, and GraphSAGE-8 0.44 and 0.50 above. With the refresh alone "
    "(`halo_gradients=\"detach\"`, the default between the two `\"auto\"`s) GCNII-16 ended 1.51 and 1.48 below "
    "(1.07 at 1M) and did not reach 99% of exact's best validation accuracy in 30 epochs; with neither "
    "(`refresh_every=0`) 6.53 and 4.90 below (8.58 at 1M). The gradient tables hold a row per boundary node and layer "
    "and cost no bytes between stages (the gradients stay on the stage that reads the rows). Their cost went down: "
    "the halo rows' gradient is now taken by a hook on the chunk's local rows in the backward pass, where each halo "
    "row was a leaf tensor copied into those rows (autograd then cloned the whole local gradient for each such copy "
    "and kept the leaf until the backward); the copy of the chunk's own rows into its local rows hands its gradient "
    "on as a view as well (`lightning_gnnpipe/nn/chunk_runner.py`), which also shortens the step without the "
    "gradients. GCNII-16, 300k, one session, before that change (2-epoch fits, the second epoch last): "
    "`halo_gradients=\"fresh\"` 13.08 / 11.57 s of training, largest rank 2.69 GiB, against `\"detach\"`'s 10.41 / "
    "9.20 s, 1.94 GiB; after it (3-epoch fits, alternating) `\"fresh\"` 9.0-9.9 s (epochs 2 and 3 of 2 runs), "
    "largest rank 2.17-2.21 GiB, "
    "against `\"detach\"`'s 8.2-9.3 s, 1.95-2.06 GiB. At 1M (2 epochs, the second): `\"fresh\"` 39.9-40.2 s "
    "of training (3 runs), largest rank 3.93-3.94 GiB, against `\"detach\"`'s 36.3-36.5 s and 3.44 GiB (2 "
    "runs); before the change `\"fresh\"` peaked at 7.2-7.6 GiB in the 30-epoch runs.")

SINCE = [
    "**Current code, re-measured.** The tables further down are records of earlier code (most of them on a faster "
    "2-core host); the first table here is the current code on this page's latest host, every row from runs of one "
    "session made alone on the machine (`python -m benchmarks.time_to_accuracy.worker` through `bench.measure`, free "
    "link, 2-epoch fits, the second epoch; they are the cached records the tables below read, which take a mode's "
    "latest run; a later session's alternating pairs, on a faster host: [below](#alternating-pairs-a-later-session)). "
    "Epochs to 99% of "
    "exact's best validation accuracy come from the 30-epoch accuracy runs below. Sessions differ: the single "
    "process's 300k GCNII-16 epoch took 21.4 + 3.5 s in the previous session and 18.1-19.3 + 3.1-3.2 s in this one "
    "(3 runs), its GraphSAGE-8 epoch 11.8 + 2.5 s against 10.3 + 2.2 s, while GNNPipe's changed less, so every ratio "
    "pairs runs of one session (in the previous one GNNPipe's defaults reached 99% in 0.66x, 0.64x, 0.73x and, at "
    "1M, 0.74x the single process's time). The latest session (the rows so marked, one run each, the link table's "
    "runs) measured the 300k rows once more.",
    "",
    "| nodes | model | mode | GNNPipe train + val s / epoch | exact, one process | epoch ÷ exact "
    "| epochs to 99% (GNNPipe, exact) | s to 99% ÷ exact (≤ 0.7x) | peak USS, largest rank (exact) |",
    "|---|---|---|---|---|---|---|---|---|",
    "| 300k | gcnii16 | `GNNPipeStrategy()` (3 runs) | 9.8-10.6 + 3.8-4.3 | 18.1-19.3 + 3.1-3.2 (3 runs) "
    "| 0.65x (medians; 0.60x-0.70x) | 30, 28 (seed 0); 28, 27 (seed 1) | 0.70x, 0.68x (medians; the latest pair "
    "0.64x, 0.62x) | 1.8-1.9 GiB (3.3) |",
    "| 300k | ressage8 | `GNNPipeStrategy()` | 7.3 + 2.4 | 10.3 + 2.2 | 0.78x | 30, 30 (both seeds) | 0.78x "
    "| 1.6 GiB (2.8) |",
    "| 300k | gcnii16 | `GNNPipeStrategy()`, latest session | 9.6 + 4.4 | 20.3 + 3.4 | 0.59x | 30, 28 (seed 0); 28, 27 "
    "(seed 1) | 0.63x, 0.61x | 1.9 GiB (3.3) |",
    "| 300k | ressage8 | `GNNPipeStrategy()`, latest session | 7.6 + 2.4 | 10.5 + 2.2 | 0.79x | 30, 30 (both seeds) "
    "| 0.79x | 1.6 GiB (2.8) |",
    "| 1M | gcnii16 | `GNNPipeStrategy()` (4 runs) | 36.6-41.0 + 12.7-15.1 | 68.6-72.3 + 11.7-12.4 (3 runs) "
    "| 0.66x (medians; 0.58x-0.70x) | 29, 27 | 0.71x (medians; the latest pair 0.70x) "
    "| 3.86-4.00 GiB (10.26) |",
    "",
    "**A cheaper exact forward.** GNNPipe's exact validation (and the history refresh it carries) costs less than in "
    "the records below, at the same values (the tests compare the outputs bit for bit; the 2-epoch runs' validation "
    "accuracies agree to every digit): while it runs, blocks below 32 MiB (a chunk's rows up to 1M nodes) come from "
    "glibc's heap and are reused chunk after chunk instead of faulted in as fresh mappings under the ranks' 16 MiB "
    "threshold (`lightning_gnnpipe.strategy.allocator.evaluation_heap`; the heap's free pages go back to the OS when "
    "it ends); the refresh reads each table's rows straight from the stage's chunk-ordered rows; GCN2Conv's mix after "
    "the aggregation scales and adds in place, as PyG's own forward does; a chunk's block reads its local rows in "
    "place: where every conv of the block gets the block's input unchanged (a GCNII layer, a PyG `BasicGNN` layer, a "
    "`DeepGCNLayer` other than `\"res+\"`) and nothing records a gradient, the chunk's CSR adjacency with its "
    "columns renamed to positions in the layer's rows multiplies those rows directly "
    "(`lightning_gnnpipe/nn/positional_rows.py`), so the chunk's inner rows are not copied and its halo rows not "
    "gathered (the renamed columns, a 4-byte index per adjacency entry of the stage, about 84 MiB per stage at 1M, "
    "live while the forward runs); and the stages hand their rows (and GCNII's `x0`) to each other in the plan's "
    "chunk order, not back in node order and out of it again at every boundary. GCNII-16, 2-epoch fits, the second "
    "epoch: at 300k, reading in place against gathering, alternating in one session, 4 fits each, validation 4.14-4.70 "
    "s against 4.57-4.96 s; at 1M, validation 12.7-15.1 s (4 runs of the current code; 14.0 and 14.3 "
    "s in 2 runs that read in place but still reordered the rows at the stage boundary) against 15.4-16.3 s before "
    "both in the previous session, largest rank 3.86-4.02 GiB peak USS against 3.93-3.94 GiB. A refresh that "
    "copies the table block by block (cache-sized blocks: "
    "the rows read once, the table read and written once) measured no faster in the fits (1M: 14.35 against 14.01 "
    "s; 300k: 4.30 and 4.45 against 4.31 and 4.08 s) and was left out. GraphSAGE-8 (residual `\"res+\"` blocks, "
    "which normalise their input before the conv) validates graph-parallel and gains nothing from these. Where the "
    "rest goes: in one process with the ranks' allocator settings (`torch.set_num_threads(2)`), the two GCNII-16 "
    "stages' exact forward now takes 12.5-12.8 s at 1M against 11.4-12.6 s for the whole-graph CSR forward, and "
    "3.5-3.7 s against 3.4-3.6 s at 300k: the stages compute what the single process computes in about its time. In "
    "a fit each stage's forward takes 15-20% longer than in that process (300k, timed inside the ranks: 2.1-2.5 s a "
    "stage, both cores busy, the waiting rank using 0.05 s of CPU, the stage boundary 0.03 s), for reasons not found "
    "here. Evaluating the graph-parallel way (`evaluation=\"graph_parallel\"`) took 15.0 s at 1M in the previous "
    "session, with the largest rank at 4.11 GiB.",
    "",
    DEFAULT_HALO,
    "",
    "So GNNPipe's defaults reach 99% of exact's best validation accuracy in 0.68x-0.70x the single "
    "process's time at 300k with GCNII-16 (medians of 3 runs each in one session; 0.61x-0.64x with the latest pairs), "
    "0.71x with GCNII-16 (medians of 4 and 3 runs; 0.70x with the latest pair; 0.65x and 0.66x in two pairs of a "
    "later session on a faster host, where the single process spent 31.7-32.7 of its 93-95 CPU seconds an epoch in "
    "the kernel, 1.6M minor page faults, and each GNNPipe rank 7.5-9.7 of 29-31) at "
    "1M, and 0.78x-0.79x with GraphSAGE-8 at 300k: on that host the 0.7x target is met, at best, at the line for "
    "GCNII-16 and missed for GraphSAGE-8. On the later session's host ([alternating "
    "pairs](#alternating-pairs-a-later-session)) the "
    "single process is the slower, and the target is met at 300k with both models (medians: 0.56x and 0.54x with "
    "GCNII-16, 0.64x with GraphSAGE-8, whose pairs range 0.59x-0.71x) and at 1M with GCNII-16, and missed at 1M with "
    "GraphSAGE-8 (0.76x, median of 3 pairs, with one epoch fewer than exact training: 29 against 30; training 0.69x, "
    "16.1 against 23.4 s, validation 1.33x, 5.7 against 4.3 s; 0.84x in 2 later pairs on this page's latest host, "
    "training 0.77x, validation 1.40x). There the single process spends a third of its CPU "
    "time in the kernel, faulting in fresh pages for its whole-graph tensors (1M GraphSAGE-8: 16.2-18.1 of 46-52 CPU "
    "seconds an epoch, 757k minor page faults; GNNPipe's ranks 5.8-7.7 of 18-22 each, 328k-415k; the worker's "
    "`user_s`, `sys_s`, `minflt`), which that host makes dearer. Where the time goes, GCNII-16: GNNPipe's "
    "training step is "
    "0.53x the single process's at 300k (medians, 10.3 against 18.8 s) and 0.58x (40.0 against 69.0 s) at 1M "
    "(two processes on two cores: half the work each, and the pipeline's fill and drain of 1 / 9 of a step with "
    "K = 8), its pipelined exact validation 1.28x at 300k (4.0 against 3.2 s) and 1.12x (13.6 against 12.1 s) at 1M, "
    "and it needs 1-2 more epochs (30 "
    "against 28, 28 against 27, 29 against 27). GraphSAGE-8 at 300k: training 0.71x (7.3 against 10.3 s; 7.6 "
    "against 10.5 s in the latest session), "
    "validation (graph-parallel, `evaluation=\"auto\"`) 1.09x (2.4 against 2.2 s); its training step sends the "
    "halo rows' gradients to their owners (`halo_gradients=\"fresh\"`; without them, in the previous session, 7.0 "
    "against 7.9 s). Evaluating GCNII-16 graph-parallel as well (`evaluation=\"graph_parallel\"`: its history "
    "refresh then runs in that forward too, each rank sending its part's rows of every table to the table's stage, "
    "`lightning_gnnpipe/strategy/graph_parallel_refresh.py`; the tables equal the pipelined refresh's) was no faster "
    "at 1M in the previous session (15.0 s); `\"auto\"` keeps the pipelined forward for GCNII-16, whose "
    "graph-parallel forward sends 2.8x the bytes. Running a layer once on all rows instead of chunk by chunk (the "
    "chunks' CSR operators side by side) was tried in an earlier session and left out: GCNII-16's validation 5.95 "
    "-> 5.65 s, GraphSAGE-8's unchanged, but the largest rank's peak USS grew by 0.3 GiB (whole-graph temporaries "
    "instead of chunk-sized ones), 2 runs each.",
    "",
    "Measuring memory costs CPU: the benchmark's sampler in each process reads USS and PSS from the kernel's page "
    "tables (`psutil`'s `memory_full_info`, about 25 ms of a core for a 3-GiB process). It used to read them 5 times "
    "a second in every process, which took a larger share of the cores from GNNPipe's three processes (the launcher "
    "and two ranks) than from the single process; it now reads the kernel's counters (`/proc/self/status`) 5 times a "
    "second and USS and PSS only at a new high of the private memory, and at least every 2 s "
    "(`benchmarks/harness/memory.py`). With the old sampler, same code and session, 2 runs: GNNPipe's GCNII-16 epoch "
    "13.6 + 6.2 s against exact's 22.6 + 3.9 s (0.75x; now 0.69x). The records further down were all measured with "
    "the old sampler.",
    "",
    "Since the records: a GCNII layer (`lightning_gnnpipe.nn.gcnii.GCNIILayer`) and PyG's `DeepGCNLayer` compute "
    "only a chunk's inner rows on the sparse path (`lightning_gnnpipe/nn/inner_rows.py`), where they also computed "
    "its halo rows and dropped them (on an earlier host, 300k, 2 runs each: GCNII-16's option 21.4 + 8.9 -> 14.7 + "
    "6.8 s, GraphSAGE-8 14.1 + 3.9 -> 9.6 + 3.3 s; 1M GraphSAGE-8 52.3 + 16.5 -> 39.2 + 13.2 s); a stage's exact "
    "forward keeps the rows in chunk order, so that a chunk's output is a slice copy, not a scatter; the single "
    "process runs with torch's transparent huge pages, as the strategies' ranks do (`THP_MEM_ALLOC_ENABLE=1`: "
    "GCNII-16 at 300k -12% an epoch, GraphSAGE-8 at 1M -23%, so the records' seconds-to-99% ratios are that much "
    "too favourable to GNNPipe). Memory against time: computing fewer rows makes a chunk's tensors smaller (at "
    "300k, 37,500 rows x 64 floats, 9.2 MiB), below the ranks' 16 MiB mmap threshold, so they come from the heap, "
    "which keeps its freed pages (at 300k +0.2-0.4 GiB peak USS); `GNNPipeStrategy(heap_mmap_threshold=8 * 2**20)` "
    "gave GCNII-16's defaults 1.19 GiB at 13.9 + 7.7 s an epoch (one run). At 1M a chunk's tensors (30.5 MiB) are "
    "fresh mappings above the threshold; glibc's dynamic threshold (`heap_mmap_threshold=None`) gave GraphSAGE-8's "
    "1M epoch -9% at the same peak USS (one run).",
    "",
    "Against graph parallelism, in the latest session (2 epochs, the second, one run each, alone on the machine; "
    "the link table below reads these runs): on the free link graph parallelism's epoch is 11.8 + 3.6 s with "
    "GCNII-16, 1.11x GNNPipe's defaults' 9.6 + 4.4 s (1.26x in the previous session: 13.0 + 4.0 against 9.8 + 3.8 "
    "s), and 7.7 + 2.5 s with GraphSAGE-8, 1.02x GNNPipe's 7.6 + 2.4 s; at the 100 Gbit/s rate (163 Mbit/s) "
    "GNNPipe's GCNII-16 epoch takes "
    "17.4 + 8.1 s and graph parallelism's 34.2 + 15.2 s, 1.94x, sending 2.96x GNNPipe's bytes (0.45 against 0.15 GiB "
    "a training step; the halo rows' gradients cross no link), and with GraphSAGE-8 14.8 + 8.5 against 19.3 + 8.5 s, "
    "1.19x; at the 10 Gbit/s rate (16 Mbit/s) 88.3 + 46.2 against 243.4 + 121.7 s, 2.72x (2.50x on the older "
    "host); at the 400 Gbit/s rate (654 Mbit/s) 11.2 + 4.7 against 16.2 + 6.1 s, 1.40x (0.93x in the older host's "
    "records, before the exact forward read rows in place). GPipe (`schedule=\"gpipe\"`): 10.8 + 3.4 s on the free "
    "link, 18.2 + 7.2 s at 163 Mbit/s, at 3.2-3.3 GiB on the largest rank against 1F1B's 1.9 GiB; the hybrid 2 x 2 "
    "(4 processes on the 2 cores): 11.8 + 9.2 s, 41.6 + 32.2 s and 16.3 + 14.0 s on the free link and at 163 and 654 "
    "Mbit/s, sending 0.71 GiB a training step. "
    "On the free link the graph-parallel evaluation was the faster one for GCNII-16 in an earlier session "
    "(`GNNPipeStrategy(evaluation=\"graph_parallel\")`, one run: validation 4.5-5.0 against 6.2 s pipelined, before "
    "the cheaper exact forward), but `\"auto\"` keeps the pipelined one, which sends 0.35x its bytes.",
]


SETUP = [
    "```bash",
    "python -m benchmarks.time_to_accuracy.bench              # every run the cache lacks, then this page (root: netns)",
    "python -m benchmarks.time_to_accuracy.bench --page-only  # this page from benchmarks/time_to_accuracy/runs.jsonl",
    "```",
    "",
    "* Graph (`benchmarks/time_to_accuracy/graph.py`): 300,000 nodes, about 6M directed edges (and a 1M rung "
    "below), communities of "
    "consecutive nodes on a ring with most edges inside them and long-range edges gathered on a few connector nodes "
    "(METIS with K = 8 cuts about 15% of the edges); a node's label is its community's class (with some noise), its "
    "features a weak copy of the class plus noise, so the graph is needed (the MLP row).",
    "* Models (`benchmarks/time_to_accuracy/models.py`): residual GraphSAGE-8 (DeepGCNLayer res+, LayerNorm, hidden "
    "64, Adam lr 0.003) and GCNII-16 (hidden 64, Adam lr 0.01), no dropout, so every mode computes the same function "
    "of the weights.",
    "* Modes: the exact single process (a plain PyTorch loop on a CSR adjacency, 2 threads), `GNNPipeStrategy()` "
    "(every default: K = 8, 2 stages, schedule `auto`), `GraphParallelStrategy()` (2 partitions) and the hybrid "
    "(`GNNPipeStrategy(graph_parallel_size=2)`, 4 processes on 2 cores).",
    "* Link: the ranks run in a network namespace the benchmark makes and removes (`ip netns add`, `ip link set lo "
    "up`), talking over its loopback (127.0.0.1) shaped with `tc qdisc add dev lo root tbf rate R`; the free link is "
    "the host's loopback. Both directions of every transfer pass the one shaped queue, so the emulated link is R "
    "shared by both directions (a cluster link carries R each way): it charges bidirectional traffic (a pipeline's "
    "activations and gradients, graph parallelism's halo exchange) twice as much as a full-duplex link would. "
    "Seconds per epoch are the second epoch of a 2-epoch run made alone on the machine.",
    "* Accuracy: 30 epochs (at 300k seeds 0 and 1 for exact and GNNPipe's defaults, seed 0 for the other modes; at "
    "1M seed 0), validation "
    "every epoch, on the free link; under a "
    "shaped link the numerics are the same (only transfers are slower), so time to accuracy at R is the free-link "
    "run's epochs times the epoch measured at R. Seconds marked * are the long run's own median epoch (no quiet "
    "2-epoch run of that mode): at 300k those runs may have shared the machine; at 1M they ran alone, except exact "
    "GCNII-16's, whose first 17 epochs shared it with a test run (its seconds are a quiet 2-epoch run's; below). The "
    "300k GCNII-16 accuracy runs other than the option's seed 0 predate computing `x0` on each stage, which changes "
    "only the summation order of the input layer's gradient (the option's seed-0 run, made again, gave the same best "
    "validation accuracy, 0.7565 at epoch 30); their seconds per epoch are the current code's quiet runs.",
    "* 1M rung (`--only large`): the same generator at 1,000,000 nodes and about 20M edges, one seed, free link: "
    "residual GraphSAGE-8 (the MLP, exact, GNNPipe's defaults, graph parallelism) and GCNII-16 (exact, GNNPipe's "
    "defaults and GNNPipe with `refresh_every=1, halo_gradients=\"fresh\"`). Graph parallelism (exact by "
    "construction) is not run with GCNII-16 at 1M (about 30 minutes of both cores).",
]


FINDINGS = [
    "What the link adds to an epoch is, within the noise of one run, the seconds its bytes need at R: neither mode "
    "hides its transfers behind compute here: not GNNPipe's default 1F1B, not GPipe, which sends every chunk's "
    "activations before the first backward (GCNII-16, 163 Mbit/s: 25.4 s against 1F1B's 25.5 s), and not graph "
    "parallelism, whose halo exchange precedes every layer's compute. So the per-epoch ratio follows the bytes ratio. "
    "GNNPipe's traffic, `2 (S-1) |V| d`, does not depend on the cut; graph parallelism's, `2 L H d`, does, and a "
    "2-way METIS cut of a community graph leaves few halo nodes: on this graph graph parallelism sends 1.5x GNNPipe's "
    "bytes with GraphSAGE-8 and 3.0x with GCNII-16. GCNII's initial embedding `x0` crosses no stage boundary: the "
    "later stage computes it from the features with its copy of the input layer, whose weights and their gradients "
    "(16 KiB each way a step) cross instead; sending `x0` beside the rows cost twice the bytes (0.30 GiB a "
    "training step "
    "against 0.15 GiB) and put GNNPipe's epoch at 163 Mbit/s at 39.1 s (1.19x graph parallelism's). "
    "GNNPipe's exact validation (`evaluation=\"auto\"`) runs the graph-parallel way with GraphSAGE-8, sending every "
    "layer's halo rows as graph parallelism does (1.42x the pipelined forward's bytes), and the pipelined way with "
    "GCNII-16 (the graph-parallel way would send 2.83x its bytes; below).",
    "",
    "GCNII-16 under GNNPipe (Adam, lr 0.01, constant): the training loss follows exact training for 17 epochs "
    "(1.31 against 1.40 at epoch 18), then rises and swings (1.23 to 1.91) while exact's keeps falling, and validation "
    "accuracy falls from 0.69 to 0.2-0.6 (exact training itself dips from 0.70 to 0.62 at epoch 14 at this learning "
    "rate and recovers). Graph parallelism, exact by construction, follows exact training. Measured against that "
    "(seed 0, test accuracy at the best validation epoch, exact 0.7596): fewer chunks do not help (K = 2: -5.08 "
    "points, K = 4: -6.15, K = 8: -6.53), nor `halo_gradients=\"stale\"` (-7.89; with `refresh_every=1` -5.27: "
    "the halo rows' gradients one epoch late unsettle it as much as stale rows do) or `refresh_every=2` (-7.98); "
    "`history_momentum=0.5` (-1.61) and `refresh_every=1` (-1.49) keep most of it. With `refresh_every=1` the tables "
    "are exact at each epoch's start, so with one step per epoch every halo row a chunk reads is exact: the training "
    "forward is exact training's, and only the gradients that reach halo rows are lost (its validation is the refresh, "
    "so it runs no extra forward). Adding `halo_gradients=\"fresh\"` hands those gradients to the owner chunk in the "
    "same epoch where its backward comes later, and runs the chunks in reverse order every other epoch, so every cut "
    "edge's gradient arrives every second epoch: GNNPipe then tracks exact training on both seeds (no collapse; "
    "training loss 0.99 and 1.01 at epoch 30 against exact's 0.97 and 0.95) and ends within 0.35 points of it "
    "(0.7561 against 0.7596, 0.7502 against 0.7515), at 2.9 GiB peak USS per rank against 1.8 GiB without the "
    "gradients, before the hook that now takes them (2.2 "
    "against 2.0 GiB, above; its gradient "
    "table keeps rows for the boundary nodes alone, 24% of the nodes here). Then, on the earlier host, its "
    "time to 99% (0.84x and 0.81x "
    "exact's, target 0.7x) goes to its epoch, 0.78x exact's (quiet 4-epoch run: training 8.9 s against exact's "
    "13.7 s, but the pipelined validation, the stages one after the other and also the refresh, 4.3 s against "
    "3.1 s; the defaults' 7.5 and 6.8 s), and to more epochs: 30 against exact's 28 on seed 0, 28 against 27 on "
    "seed 1 (the seed-1 run predates computing `x0` on each stage, which left seed 0's run the same to four digits: "
    "best validation accuracy 0.7565 at epoch 30 both times). At the 100 Gbit/s rate its epoch (17.5 s training, "
    "8.2 s validation) is 0.55x graph parallelism's, and it reaches 99% in 0.59x graph parallelism's time. With a "
    "cosine-annealed learning rate neither mode "
    "oscillates and GNNPipe ends 1.73 points below exact (0.7062 against 0.7235; with `history_momentum=0.5` as well "
    "2.15); at lr 0.005 GNNPipe follows exact "
    "for 24 epochs and then its validation accuracy falls (0.69 to 0.44) while its own training loss keeps falling "
    "(1.40 to 1.33, below exact's): the weights fit the pipelined forward, with its historical halo rows and without "
    "the halo rows' gradients, and drift from the exact one. The defaults then and each single option miss "
    "the 0.5-point "
    "target on GCNII-16; `refresh_every=1, halo_gradients=\"fresh\"`, the defaults since `halo_gradients=\"auto\"`, "
    "meets it on both seeds. With residual "
    "GraphSAGE-8 GNNPipe's defaults track exact training epoch by epoch.",
    "",
    "Validation: with `evaluation=\"auto\"` GNNPipe evaluates the graph-parallel way where that sends at most "
    "twice the pipelined forward's bytes (GraphSAGE-8 here): the stages' weights "
    "are copied to both ranks, each takes 4 of the 8 chunks, grouped so that they read each other's rows (at 300k "
    "26k and 27k halo rows, as few as a 2-way METIS cut's 33k and 24k), through all layers, and the ranks exchange "
    "halo rows before each layer. In an earlier session, on the free link, its validation cost less than the single "
    "process's: 1.49 s at 300k against exact's 2.04 s, and 5.92 s at 1M against 6.66 s; with the stages one after "
    "the other (`evaluation=\"pipeline\"`) it took 2.75 and 11.64 s. The current code's runs measure it at "
    "1.09x-1.33x the single process's (the first table and the pairs). Its cost is memory: each rank keeps its "
    "group's chunk "
    "graph and computes a whole group's rows per layer; the largest 1M rank peaked at 3.84 GiB USS against 3.40 GiB. "
    "With GCNII-16 the pipelined forward sends `|V| x d` once (the graph-parallel way 2.83x that), so `\"auto\"` keeps "
    "it: 6.8 s on the free link against exact's 3.1 s, 11.6 s at 163 Mbit/s, 49.5 s at 16 Mbit/s (graph "
    "parallelism's validation there: 117.3 s).",
    "",
    "Why the graph-parallel evaluation does not beat the single process on this host (`python -m "
    "benchmarks.time_to_accuracy.validation_probe --part threads`): the single process's exact forward of "
    "GraphSAGE-8 at 1M takes 9.95-13.19 s on one thread and 4.47-6.42 s on two (the medians' ratio 2.28x; 2.05x in "
    "a second call, 11.8 against 5.8 s), so one thread computing half the rows needs about what two threads need for "
    "all of them. Each graph-parallel rank computes its half of the rows (and normalises its halo's) on one core: "
    "5.5-7.4 s at 1M in the fits of the latest host, against exact's 4.0-4.5 s after its training step. Validation at the single "
    "process's cost or below needs one core to do half the work in half the time, which this host's two cores do not "
    "give. The training step fares better: each rank's "
    "compute, 12.2-16.3 s a step on one core in the 1M GraphSAGE-8 pairs, is 0.5x-0.7x the single process's "
    "21.8-25.0 s on two; their bubble and waits add 1.7-3.0 s.",
    "",
    "Why the stages one after the other are slower than one process (`python -m "
    "benchmarks.time_to_accuracy.validation_probe --part fit [--allocator glibc]`, GraphSAGE-8 at 300k, three "
    "`Trainer.validate` calls, `evaluation=\"pipeline\"`): a waiting rank costs nothing (0.00 s of CPU over a 2.00 s "
    "wait in gloo's recv), and in one process the two stages' exact forward costs what the single process's does "
    "(1.76-2.09 s against 1.69-1.99 s, 2 threads). In a fit, the stage on the rank that the strategy starts took "
    "1.16-3.17 s, 0.53-2.49 s of it kernel time, against 1.11-1.25 s (0.36-0.53 s kernel) on the rank that calls "
    "`validate`. The difference is kernel time on fresh memory under the allocator settings the strategy gives the "
    "ranks it starts (torch's transparent huge pages, a 16 MiB glibc mmap threshold). Without them "
    "(`--allocator glibc`) that stage took "
    "0.98-1.07 s (0.29-0.45 s kernel) and the whole exact forward 2.01-2.37 s against 2.34-4.45 s. Those settings "
    "keep the training step's memory down and its time short (docs/results/notes/memory.md); the graph-parallel "
    "evaluation runs under them too and is faster because both ranks compute at once, each half the rows.",
    "",
    "The hybrid 2x2 runs 4 processes on the 2 cores and sends the most (0.71 GiB a training step: stage boundaries "
    "0.29, halo rows and their gradients 0.39, logits 0.04), so it is the slowest mode here: 21.0 s an epoch on the "
    "free link, 30.3 s at 654 Mbit/s, 73.7 s at 163 Mbit/s (not run at 16 Mbit/s: about 25 minutes). Its "
    "exact validation receives each partition's halo rows once per layer; "
    "summing every layer's whole `(|V|, d)` output over the partitions instead (measured with that variant) takes "
    "149.1 s of validation at 163 Mbit/s against 33.5 s (free link: 11.3 s against 10.1 s).",
    "",
    "1M nodes, 20M edges (residual GraphSAGE-8, free link, one seed; seconds from quiet 2-epoch runs of one later "
    "session, the tables' latest): GNNPipe's defaults end 0.75 points above exact training (0.6843 against 0.6768) "
    "and reach 99% of exact's best validation accuracy one epoch earlier (29 against 30), `refresh_every=0` ends "
    "level (0.6771); its training step is 0.72x the single process's (16.1 against 22.4 s) and its exact validation "
    "(graph-parallel) 1.33x (5.5 against 4.1 s), so the time to 99% is 0.79x in that pair (0.71x-0.80x over the "
    "session's 3 pairs, [above](#alternating-pairs-a-later-session)): the 0.7x target is missed at this size with "
    "GraphSAGE-8. Graph parallelism (18.2 + 5.3 s) takes about GNNPipe's time per epoch on the free link. In an "
    "earlier session on a slower host `refresh_every=0` took 19.70 s of training against exact's 32.98 s, 0.65x to "
    "99%. Twice the chunks (`GraphChunkDataModule(num_chunks=16)`, batch 2026-12-06T19:36:28 of `pairs.jsonl`, "
    "alternating with K = 8 twice on a later host) halve the pipeline's bubble (0.59-0.91 s a rank against "
    "1.14-2.05 s) but add about as much compute and waiting (their halos: more rows gathered and normalised): "
    "training 17.24 and 17.48 s against 16.78 and 18.66 s, validation 5.99-6.27 s against 5.76-7.43 s, at "
    "3.42-3.45 against 3.79-3.80 GiB peak USS on the largest rank.",
    "",
    "1M nodes, GCNII-16 (free link, one seed): with `refresh_every=1, halo_gradients=\"fresh\"` GNNPipe ends 0.46 "
    "points below exact training (test accuracy 0.7457 against 0.7503 at the best validation epoch; 99% of exact's "
    "best validation accuracy after 29 epochs against 27) at 0.66x the single process's peak USS per rank (7.21 "
    "against 10.87 GiB). Its epoch is 40.6 s of training and 17.7 s of validation (the pipelined refresh) against "
    "exact's 69.5 + 9.9 s in a quiet 2-epoch run, which gives the tables' 0.79x. A fresh process's first epochs are "
    "slower, though (GraphSAGE-8 at 1M: 50 and 55 s, then 33 s), and the last 13 epochs of exact's long run, alone on "
    "the machine, took 56.1 + 10.4 s: against those the option's epoch (40.0 + 18.0 s over the same epochs) is 0.87x "
    "exact's and its time to 99% 0.94x. Either way it misses 0.7x: its validation, the stages one after the other and "
    "also the refresh, costs 1.7x exact's. GNNPipe's defaults end -8.58 points from exact training there (test "
    "accuracy 0.6645 at the best validation epoch, 17; 31.3 + 24.3 s an epoch, peak USS 4.36 GiB per rank).",
    "",
    "Time against memory: the strategy's allocator settings (transparent huge pages, a 16 MiB mmap threshold) keep "
    "each rank lean at some cost in time. With glibc's own heap (`GNNPipeStrategy(huge_pages=False, "
    "heap_mmap_threshold=None)`, the same numerics; residual GraphSAGE-8, free link, 2 epochs, second timed, one run "
    "each) GNNPipe's training step took 3.96 s against 5.22 s on the page's graph and 6.91 s against 9.28 s on the "
    "spread graph, its validation 1.38 s against 1.49 s and 3.19 s against 5.18 s, while the largest rank's peak USS "
    "rose from 1.45 to 2.04 GiB and from 1.90 to 2.77 GiB. With the same epochs to accuracy, that epoch would reach "
    "99% of exact's best validation accuracy at 300k in (3.96 + 1.38) / (6.60 + 2.04) = 0.62x exact's seconds "
    "(target 0.7x; 0.78x with the defaults). With GCNII-16 on the page's graph the defaults' epoch went from 7.5 + "
    "6.8 s to 5.7 + 3.4 s and the largest rank's peak USS from 1.59 to 2.95 GiB. At 1M nodes glibc's heap loses on "
    "both counts (GraphSAGE-8, one run beside the defaults' on a later host, records in `runs.jsonl` and "
    "`pairs.jsonl`, batch 2026-12-06T18:35:25): 22.75 + 5.47 s an epoch against 16.83 + 6.14 s, the largest rank at "
    "5.45 against 3.77 GiB peak USS, its ranks faulting in 2.6M and 3.9M pages an epoch against 0.39M and 0.30M (no "
    "huge pages) and one of them spending 12.1 s in the kernel against 6.9 s. glibc's largest mmap threshold "
    "(`heap_mmap_threshold=32 * 2**20`, huge pages kept; batch 2026-12-06T19:28:22 of `pairs.jsonl`, alternating "
    "with the defaults twice) shortens the 1M training step by 4-7% (15.75 and 16.29 s against 16.8 and 16.99 s; "
    "validation 5.54 and 6.28 s against 5.76 and 7.03 s; kernel time 4.6-6.1 s a rank against 6.7-7.8 s) at "
    "4.69-4.71 against 3.74-3.78 GiB peak USS on the largest rank: the defaults keep the memory.",
]


def ok(rec: Optional[dict]) -> bool:
    return rec is not None and rec.get("status") == "ok"


def timed(rec: dict, key: str) -> Optional[float]:
    vals = [e[key] for e in rec["epochs"][1:] if e.get(key) is not None] or [e[key] for e in rec["epochs"]
                                                                            if e.get(key) is not None]
    return statistics.median(vals) if vals else None


def best_epoch(rec: dict) -> Tuple[int, float, float]:
    """``(epoch index, val acc, test acc)`` of the best validation accuracy (first on ties)."""
    rows = rec["epochs"]
    i = max(range(len(rows)), key=lambda e: (rows[e].get("val_acc", -1), -e))
    return i, rows[i]["val_acc"], rows[i]["test_acc"]


def to_target(rec: dict, target: float) -> Tuple[Optional[int], Optional[float]]:
    """Epochs (from 1) and training + validation seconds until validation accuracy first reaches ``target``."""
    seconds = 0.0
    for e, row in enumerate(rec["epochs"]):
        seconds += row["train_s"] + row["val_s"]
        if row.get("val_acc", -1) >= target:
            return e + 1, seconds
    return None, None


def largest(rec: dict, kind: str) -> Optional[int]:
    procs = rec.get("processes") or {}
    ranks = [p for role, p in procs.items() if role.startswith("rank")] or [procs.get("main", {})]
    vals = [max(p.get(kind, 0), p.get("vm_hwm", 0)) if kind == "rss" else p.get(kind, 0) for p in ranks]
    return max(vals) if vals else None


def gib(b: Optional[float]) -> str:
    return "–" if b is None else f"{b / GIB:.2f}"


def index(records: List[dict]) -> Dict[tuple, dict]:
    """Records by ``(nodes, model, mode, seed, chunks, epochs, validate, threads, rate)``."""
    out = {}
    for rec in records:
        s = rec["spec"]
        out[(s["graph"]["num_nodes"], s["model"], s["mode"], s["seed"], s["chunks"], s["epochs"], s["validate"],
             s.get("threads"), s["rate_bits"])] = rec
    return out


def model_key(s: dict) -> str:
    """The model of a spec, with its learning rate and schedule when the spec sets them (``gcnii16 (lr 0.005)``,
    ``gcnii16 (cosine)``)."""
    extra = ([f"lr {s['lr']}"] if "lr" in s else []) + ([s["lr_schedule"]] if s.get("lr_schedule") else [])
    return s["model"] + (f" ({', '.join(extra)})" if extra else "")


def mode_key(s: dict) -> str:
    """The mode of a spec with its strategy options and a K other than 8 (``gnnpipe_refresh_every1``,
    ``gnnpipe_k2``); its label goes into :data:`LABEL` if it has none."""
    opts = sorted(s.get("strategy", {}).items())
    key = "_".join([s["mode"], *(k if (k, v) == ("halo_gradients", "stale") else f"{k}{v}" for k, v in opts)]
                   + ([f"k{s['chunks']}"] if s["mode"] == "gnnpipe" and s["chunks"] != 8 else []))
    if key not in LABEL:
        args = ", ".join(f"{k}={v!r}" for k, v in opts)
        LABEL[key] = f"`GNNPipeStrategy({args})`, K = {s['chunks']} (2 processes)"
    return key


PAIRS_INTRO = (
    "The exact single process and `GNNPipeStrategy()` one after the other, a 2-epoch fit each (the second epoch "
    "timed), several times in one session on a faster host than the table above's (`python -m "
    "benchmarks.time_to_accuracy.bench --only pairs --pairs 4`, records in `benchmarks/time_to_accuracy/pairs.jsonl`; "
    "the 1M pairs, made alone on the machine as well, one run at a time through `bench.measure` in the same order, "
    "are also the 1M runs the accuracy table reads). Seconds to 99% "
    "of exact's best validation accuracy: the medians' epoch ratio times the graph's accuracy runs' epochs to it. "
    "Rows on the spread graph (`--only pairs --spread`) also compare GNNPipe under two allocator settings, run after "
    "each pair, with that pair's exact run.")


def pair_epochs(derived: Dict[tuple, dict]) -> Dict[Tuple[int, str], List[Tuple[int, int, int]]]:
    """``(nodes, model) -> [(seed, GNNPipe's epochs to 99%, exact's)]`` of the defaults' accuracy runs."""
    out: Dict[Tuple[int, str], List[Tuple[int, int, int]]] = {}
    for (nodes, model, mode, seed), d in sorted(derived.items()):
        exact = derived.get((nodes, model, "exact", seed))
        if mode in default_modes() and exact and " (" not in model:
            out.setdefault((nodes, model), []).append((seed, d["epochs"], exact["epochs"]))
    return out


def default_modes() -> Tuple[str, str]:
    """The mode keys of ``GNNPipeStrategy()``'s runs: its own, and :data:`EXACT_FORWARD`'s (what the defaults resolve
    to in these fits)."""
    return "gnnpipe", mode_key({"mode": "gnnpipe", "chunks": 8, "strategy": EXACT_FORWARD})


def mode_order(mode: str) -> Tuple[int, str]:
    """Table order: :data:`MODES`, a tuned GNNPipe run after GNNPipe's defaults."""
    return (MODES.index(mode), "") if mode in MODES else (MODES.index("gnnpipe"), mode)


def accuracy_runs(records: List[dict]) -> Dict[tuple, dict]:
    """The free-link accuracy runs by ``(nodes, model, mode, seed)`` (:func:`model_key`, :func:`mode_key`)."""
    out = {}
    for rec in records:
        s = rec["spec"]
        if s["rate_bits"] is None and s["validate"] and s["epochs"] >= 20:
            out[(s["graph"]["num_nodes"], model_key(s), mode_key(s), s["seed"])] = rec
    return out


def quiet_epochs(records: List[dict]) -> Dict[tuple, Tuple[float, float]]:
    """Training and validation seconds per epoch measured with nothing else running (the 3-epoch runs with validation
    on the free link: the timing part and the link part's free-link runs; 4 epochs for :data:`EXACT_FORWARD`, whose
    last validation is not its refresh), by ``(nodes, model, mode)`` (:func:`mode_key`)."""
    out = {}
    exact_forward = mode_key({"mode": "gnnpipe", "chunks": 8, "strategy": EXACT_FORWARD})
    for rec in sorted(records, key=lambda r: r.get("time", "")):  # oldest first: the latest run of a mode wins
        s = rec["spec"]
        if ok(rec) and s["epochs"] <= 4 and s["validate"] and s["rate_bits"] is None and s["chunks"] == 8 \
                and s.get("threads") is None:
            seconds = (timed(rec, "train_s"), timed(rec, "val_s"))
            out[(s["graph"]["num_nodes"], s["model"], mode_key(s))] = seconds
            if mode_key(s) == "gnnpipe":  # GNNPipeStrategy() resolves to EXACT_FORWARD in these fits
                out[(s["graph"]["num_nodes"], s["model"], exact_forward)] = seconds
    # A short run's timed epoch is the same without a refresh: its validation is the last one, which writes no table,
    # and a training step costs the same reading exact or historical rows (the refresh is validation's forward). The
    # halo rows' gradients do cost time: the runs without them are timed with them dropped.
    # The defaults are refresh_every=1, halo_gradients="fresh" in a fit that validates every epoch (EXACT_FORWARD).
    detach = mode_key({"mode": "gnnpipe", "chunks": 8, "strategy": {"halo_gradients": "detach"}})
    for (nodes, model, mode), seconds in list(out.items()):
        if mode == detach:
            out.setdefault((nodes, model, "gnnpipe_refresh_every0"), seconds)
            out.setdefault((nodes, model, detach + "_refresh_every1"), seconds)
    return out


def accuracy_rows(records: List[dict]) -> Tuple[List[str], Dict[tuple, dict]]:
    """Per (graph, model, seed): one row per mode; and the derived figures by ``(nodes, model, mode, seed)``.

    Epochs come from the 80-epoch runs; seconds from the quiet 3-epoch runs of the same mode (:func:`quiet_epochs`;
    the long runs shared the machine), else from the long run itself (marked ``*``).
    """
    runs = accuracy_runs(records)
    quiet = quiet_epochs(records)
    derived: Dict[tuple, dict] = {}
    lines = ["| nodes | model | seed | mode | train s / epoch | validation s / epoch | epochs to 99% of exact's best "
             "val | s to it (÷ exact) | test acc at best val | best val acc | MiB sent / epoch | largest process "
             "peak RSS GiB (USS) |", "|---" * 12 + "|"]
    for key in sorted({k[:2] + (k[3],) for k in runs}):
        nodes, model, seed = key
        exact = runs.get((nodes, model, "exact", seed))
        if not ok(exact):
            continue
        target = 0.99 * best_epoch(exact)[1]

        def epoch_seconds(rec: dict, mode: str) -> Tuple[float, float, bool]:
            base = (nodes, model.split(" (")[0], mode)  # the learning rate does not change an epoch's seconds
            if base in quiet:
                return (*quiet[base], True)
            return timed(rec, "train_s"), timed(rec, "val_s"), False

        exact_epochs, _ = to_target(exact, target)
        exact_s = exact_epochs * sum(epoch_seconds(exact, "exact")[:2]) if exact_epochs else None
        for mode in sorted({k[2] for k in runs if k[:2] == (nodes, model) and k[3] == seed}, key=mode_order):
            rec = runs.get((nodes, model, mode, seed))
            if rec is None:
                continue
            if not ok(rec):
                lines.append(f"| {nodes:,} | {model} | {seed} | {LABEL[mode]} | {rec['status']} |" + " – |" * 7)
                continue
            epochs, _ = to_target(rec, target)
            _, val, test = best_epoch(rec)
            sent = timed(rec, "sent_bytes")
            train_s, val_s, is_quiet = epoch_seconds(rec, mode)
            seconds = epochs * (train_s + val_s) if epochs else None
            d = {"train_s": train_s, "val_s": val_s, "epochs": epochs, "seconds": seconds, "quiet": is_quiet,
                 "ratio": seconds / exact_s if seconds and exact_s else None, "test": test, "val": val,
                 "target": target, "sent": sent, "rss": largest(rec, "rss"), "uss": largest(rec, "uss")}
            derived[(nodes, model, mode, seed)] = d
            reached = "not reached" if epochs is None else f"{epochs}"
            secs = "–" if seconds is None else (f"{seconds:.0f}" + (f" ({d['ratio']:.2f}x)" if d["ratio"] else ""))
            star = "" if is_quiet else "*"
            lines.append(f"| {nodes:,} | {model} | {seed} | {LABEL[mode]} | {train_s:.2f}{star} | {val_s:.2f}{star} | "
                         f"{reached} | {secs} | {test:.4f} | {val:.4f} | "
                         f"{'–' if sent is None else f'{sent / 2**20:,.0f}'} | {gib(d['rss'])} ({gib(d['uss'])}) |")
    return lines, derived


def accuracy_summary(derived: Dict[tuple, dict]) -> List[str]:
    """Per (graph, model, mode): test accuracy at the best validation epoch, mean over seeds, minus exact's mean over
    the same seeds."""
    lines = ["| nodes | model | mode | seeds | test acc at best val (mean) | − exact (points) | epochs to 99% | "
             "s to 99% ÷ exact |", "|---" * 8 + "|"]
    groups: Dict[tuple, List[dict]] = {}
    seeds: Dict[tuple, List[int]] = {}
    for (nodes, model, mode, seed), d in derived.items():
        groups.setdefault((nodes, model, mode), []).append(d)
        seeds.setdefault((nodes, model, mode), []).append(seed)
    for (nodes, model, mode) in sorted(groups, key=lambda k: (k[0], k[1], mode_order(k[2]))):
        ds = groups[(nodes, model, mode)]
        exact = [derived[(nodes, model, "exact", s)] for s in seeds[(nodes, model, mode)]
                 if (nodes, model, "exact", s) in derived]
        acc = statistics.mean(d["test"] for d in ds)
        gap = (acc - statistics.mean(d["test"] for d in exact)) * 100 if len(exact) == len(ds) else None
        epochs = [d["epochs"] for d in ds]
        ratios = [d["ratio"] for d in ds if d["ratio"] is not None]
        lines.append(f"| {nodes:,} | {model} | {LABEL[mode]} | {len(ds)} | {acc:.4f} | "
                     f"{'–' if gap is None else f'{gap:+.2f}'} | "
                     f"{', '.join('not reached' if e is None else str(e) for e in epochs)} | "
                     f"{', '.join(f'{r:.2f}x' for r in ratios) or '–'} |")
    return lines


LINK_SESSION = ("2026-12-06T14:00:00", "2026-12-06T15:30:00")
"""Start and end (ISO times) of the session whose runs the link table reads: every rate and mode of the page's graph
was measured then, alone on the machine, so its rows and their split (free link + what the rate adds) never pair
runs of different sessions or hosts. ``None``: each mode's latest run."""


def link_runs(records: List[dict], session: Optional[Tuple[str, str]] = None,
              ) -> Tuple[Dict[tuple, dict], Dict[tuple, dict], Dict[tuple, dict]]:
    """The runs the link table reads, the latest of each (300k, K = 8, with validation): each mode's defaults and
    GPipe's (at most 3 epochs), keyed ``(model, rate_bits, mode)``, and :data:`EXACT_FORWARD`'s (at most 4),
    keyed ``(model, rate_bits)``. With ``session`` (start, end; e.g. :data:`LINK_SESSION` for the page's graph) the
    defaults' and GPipe's runs are that session's where it has one of the key (a key it lacks: the latest run)."""
    runs: Dict[tuple, dict] = {}
    tuned: Dict[tuple, dict] = {}
    exact_forward: Dict[tuple, dict] = {}
    def order(r: dict) -> Tuple[bool, str]:  # the session's runs last (they win), each group oldest first
        t = r.get("time", "")
        return session is not None and session[0] <= t <= session[1], t

    for rec in sorted(records, key=order):
        s = rec["spec"]
        if s["epochs"] <= 4 and s["validate"] and s["graph"]["num_nodes"] == 300_000 and s["chunks"] == 8 \
                and s["mode"] in SHORT:
            if s.get("strategy") == EXACT_FORWARD:
                exact_forward[(s["model"], s["rate_bits"])] = rec
            elif s["epochs"] > 3:
                continue
            elif not s.get("strategy"):
                runs[(s["model"], s["rate_bits"], s["mode"])] = rec
            elif s["strategy"] == {"schedule": "gpipe"}:
                tuned[(s["model"], s["rate_bits"], s["mode"])] = rec
    return runs, tuned, exact_forward


def link_table(records: List[dict], derived: Dict[tuple, dict], rates: Dict[int, dict],
               planner: Dict[tuple, dict], graph: str = "page") -> Tuple[List[str], List[dict]]:
    """Per model and rate: epoch (train + validation) of each mode, GP ÷ GNNPipe, time to accuracy, planner; the
    summary rows carry ``graph`` (:data:`GRAPHS`)."""
    by_rate = {None: "free (loopback)"}
    by_rate.update({r["rate_bits"]: f"{r['rate_bits'] / 1e6:,.0f} Mbit/s (= {gbit} Gbit/s between GPUs)"
                    for gbit, r in rates.items()})
    lines = ["| model | link | GNNPipe train + val = s / epoch | GNNPipe, `schedule=\"gpipe\"` | graph parallel | "
             "hybrid 2x2 | GP ÷ GNNPipe epoch | GNNPipe s to 99% (÷ GP) | GiB sent / training step (GNNPipe, GP, "
             "hybrid) | planner: predicted training s / epoch (GNNPipe, GP), choice | measured faster training step |",
             "|---" * 11 + "|"]
    summary = []
    runs, tuned, exact_forward = link_runs(records, LINK_SESSION if graph == "page" else None)
    exact_key = mode_key({"mode": "gnnpipe", "chunks": 8, "strategy": EXACT_FORWARD})
    for model in ("ressage8", "gcnii16"):
        for rate, name in by_rate.items():
            recs = {m: runs.get((model, rate, m)) for m in SHORT}
            if not any(ok(r) for r in recs.values()):
                continue
            split = {m: (timed(r, "train_s"), timed(r, "val_s")) if ok(r) else None for m, r in recs.items()}
            epoch = {m: sum(v) if v else None for m, v in split.items()}
            sent = {m: timed(r, "sent_bytes") if ok(r) else None for m, r in recs.items()}
            # graph parallelism computes exact training's step: without its own accuracy run, exact's epochs
            acc = {m: derived.get((300_000, model, m, 0)) for m in SHORT}
            acc["gnnpipe"] = acc["gnnpipe"] or derived.get((300_000, model, exact_key, 0))  # what the defaults ran
            acc["graph_parallel"] = acc["graph_parallel"] or derived.get((300_000, model, "exact", 0))
            to_acc = {m: (acc[m]["epochs"] * epoch[m]) if acc[m] and acc[m]["epochs"] and epoch[m] else None
                      for m in SHORT}
            ratio = epoch["graph_parallel"] / epoch["gnnpipe"] if epoch["gnnpipe"] and epoch["graph_parallel"] else None
            acc_ratio = (to_acc["gnnpipe"] / to_acc["graph_parallel"]
                         if to_acc["gnnpipe"] and to_acc["graph_parallel"] else None)
            plan = planner.get((model, rate))
            fastest = min((m for m in ("gnnpipe", "graph_parallel") if epoch[m]), key=lambda m: epoch[m], default=None)
            train = {m: v[0] if v else None for m, v in split.items()}  # what the planner estimates
            faster_step = min((m for m in ("gnnpipe", "graph_parallel") if train[m]), key=lambda m: train[m],
                              default=None)
            plan_cell = "–" if plan is None else (f"{plan['gnnpipe']:.1f}, {plan['graph_parallel']:.1f}: "
                                                  f"{SHORT[plan['choice']]}")
            t = tuned.get((model, rate, "gnnpipe"))
            tuned_s = timed(t, "train_s") + timed(t, "val_s") if ok(t) else None
            x = exact_forward.get((model, rate))  # refresh_every=1, halo_gradients="fresh": its epoch, to accuracy
            x_epoch = timed(x, "train_s") + timed(x, "val_s") if ok(x) else None
            x_acc = derived.get((300_000, model, exact_key, 0))
            x_to_acc = x_acc["epochs"] * x_epoch if x_epoch and x_acc and x_acc["epochs"] else None
            cell = lambda m: "–" if epoch[m] is None else f"{epoch[m]:.1f}"  # noqa: E731
            pipe = "–" if split["gnnpipe"] is None else "{:.1f} + {:.1f} = {:.1f}".format(*split["gnnpipe"],
                                                                                        epoch["gnnpipe"])
            pipe_acc = "–" if to_acc["gnnpipe"] is None else f"{to_acc['gnnpipe']:.0f}"
            lines.append(f"| {model} | {name} | {pipe} | {'–' if tuned_s is None else f'{tuned_s:.1f}'} | "
                         f"{cell('graph_parallel')} | {cell('hybrid')} | "
                         f"{'–' if ratio is None else f'{ratio:.2f}x'} | "
                         f"{pipe_acc}{'' if acc_ratio is None else f' ({acc_ratio:.2f}x)'} | "
                         f"{', '.join(gib(sent[m]) for m in SHORT)} | {plan_cell} | "
                         f"{SHORT.get(faster_step, '–')} |")
            summary.append({"graph": graph, "model": model, "rate": rate, "name": name, "epoch": epoch, "ratio": ratio,
                            "acc_ratio": acc_ratio, "sent": sent, "plan": plan, "fastest": fastest,
                            "tuned": tuned_s, "split": split, "train": train, "faster_step": faster_step,
                            "exact_forward_ratio": (epoch["graph_parallel"] / x_epoch
                                                    if x_epoch and epoch["graph_parallel"] else None),
                            "exact_forward_acc_ratio": (x_to_acc / to_acc["graph_parallel"]
                                                        if x_to_acc and to_acc["graph_parallel"] else None)})
    return lines, summary


def time_split(summary: List[dict]) -> List[str]:
    """Where an epoch's time goes under a link, per model and mode: the free link's training and validation
    seconds (compute, bubble and the host's own transfers) and what the rate adds to each; beside it the seconds
    the training step's bytes need at the rate alone (``8 * bytes / R``)."""
    free = {(row["model"]): row for row in summary if row["rate"] is None}
    lines = ["| model | link | mode | training s: free link + added by the link | validation s: free + added | "
             "training bytes at R alone (s) |", "|---" * 6 + "|"]
    for row in summary:
        base = free.get(row["model"])
        if row["rate"] is None or base is None:
            continue
        for mode in ("gnnpipe", "graph_parallel"):
            now, then, sent = row["split"].get(mode), base["split"].get(mode), row["sent"].get(mode)
            if not now or not then:
                continue
            alone = "–" if not sent else f"{8 * sent / row['rate']:.1f}"
            lines.append(f"| {row['model']} | {row['name']} | {SHORT[mode]} | {then[0]:.1f} + {now[0] - then[0]:.1f} | "
                         f"{then[1]:.1f} + {now[1] - then[1]:.1f} | {alone} |")
    return lines


SPREAD_INTRO = (
    "The same generator with `connectors=1.0` (`python -m benchmarks.time_to_accuracy.bench --only spread`): every "
    "node draws its share of the long-range edges instead of a few connector nodes, so METIS cuts as many edges as on "
    "the page's graph (0.085 at K = 2, 0.154 at K = 8) but most nodes are in the other partition's halo (0.81 |V| "
    "against 0.19 |V|), as in graphs whose hubs are everywhere. 300k nodes; seconds per epoch are the second of 2 "
    "epochs alone on the machine, accuracy 30 epochs on the free link, as above; graph parallelism's epochs to 99% "
    "are exact training's (it takes the same step: on the page's graph its validation accuracy equals exact's every "
    "epoch). Here `evaluation=\"auto\"` keeps the pipelined exact forward (the graph-parallel one would send 6.47x "
    "its bytes with GraphSAGE-8, 12.95x with GCNII-16). On the free link GNNPipe is slower here than on the "
    "page's graph, and slower than the single "
    "process (ressage8: 9.3 s of training against 5.2 s there and 6.3 s for exact training; so its time to accuracy "
    "on the free link is 1.76x exact's); the planner, timing the chunks, picks graph parallelism there. The cause "
    "is not pinned down: the 8 chunks' halos hold 2.4 |V| rows against 0.94 |V| on "
    "the page's graph, but fewer chunks, with smaller halos, do not shorten the training step (K = 2: 0.81 |V| halo "
    "rows, 10.12 s; K = 4: 1.7 |V|, 10.85 s; K = 8: 9.28 s; 2 epochs, second timed). On a later host, alternating "
    "with the single process ([pairs](#alternating-pairs-a-later-session), `--only pairs --spread`), GNNPipe's "
    "defaults take half the single process's epoch with GCNII-16 (7.3-7.7 + 2.8-2.9 s against 16.4-19.2 + 2.6-3.2 "
    "s, 0.50x), which puts its time to 99% of exact's best validation accuracy at 0.45x exact's (25 epochs against "
    "28; the accuracy below, with the older host's seconds, says 1.23x), and "
    "the single process's time with GraphSAGE-8 (7.1-7.5 + 2.1 s against 7.6-8.1 + 1.5-1.7 s, 1.00x). With GraphSAGE-8 "
    "part of the cost is fresh memory for the chunks' local rows (about 32 MB each here, above the ranks' 16 MiB "
    "mmap threshold): with glibc's largest threshold (`GNNPipeStrategy(heap_mmap_threshold=32 * 2**20)`) they come "
    "from the heap and the training step takes 6.3 s (the epoch 0.87x the single process's) at 2.61 against 2.12 "
    "GiB peak USS on the largest rank; glibc's own heap without huge pages 7.2-7.4 s at 3.27 GiB. GCNII-16's "
    "accuracy gap is "
    "larger here with the defaults (-9.51 points, one seed); with `refresh_every=1, halo_gradients=\"fresh\"` it is "
    "-0.23.")


def spread_lines(records: List[dict], rates: Dict[int, dict],
                 planner: Dict[tuple, dict]) -> Tuple[List[str], List[dict], Dict[tuple, dict]]:
    """The section on the graph whose long-range edges touch every node (the ``spread`` part): its link table,
    the graph-parallel evaluation named explicitly, and its accuracy; with the link summary and accuracy figures."""
    if not any(ok(r) for r in records):
        return [], [], {}
    acc_lines, derived = accuracy_rows(records)
    link_lines, summary = link_table(records, derived, rates, planner, graph="spread")
    lines = ["## A graph whose long-range edges touch every node", "", SPREAD_INTRO, "", *link_lines, ""]
    named = [r for r in records if ok(r) and r["spec"].get("strategy") == {"evaluation": "graph_parallel"}]
    for rec in named:
        s = rec["spec"]
        row = next((r for r in summary if r["model"] == s["model"] and r["rate"] == s["rate_bits"]), None)
        if row and row["split"]["gnnpipe"]:
            lines += [f"With `evaluation=\"graph_parallel\"` named ({s['model']}, {row['name']}) GNNPipe's "
                      f"validation takes {timed(rec, 'val_s'):.1f} s against {row['split']['gnnpipe'][1]:.1f} s for "
                      f"the pipelined one (training {timed(rec, 'train_s'):.1f} s against "
                      f"{row['split']['gnnpipe'][0]:.1f} s).", ""]
    if derived:
        lines += [*accuracy_summary(derived), "", *acc_lines, ""]
    return lines, summary, derived


def write_page(records: List[dict], path: Path, planner: Optional[Dict[tuple, dict]] = None,
               spread: Optional[List[dict]] = None, spread_planner: Optional[Dict[tuple, dict]] = None,
               planner_lines: Sequence[str] = (), pairs: Sequence[dict] = ()) -> None:
    """The page from the records of its own graph, and of the spread graph (``spread``); ``planner_lines``: the
    planner's account (:func:`benchmarks.time_to_accuracy.planner.planner_paragraph`), after the findings;
    ``pairs``: the alternating pairs' runs (:mod:`benchmarks.time_to_accuracy.pairs`)."""
    from benchmarks.time_to_accuracy.pairs import pair_lines
    from benchmarks.time_to_accuracy.rates import GPU_LINKS_GBIT, HBM_BYTES_PER_S, HBM_EFFICIENCY, derived_rates

    rates = derived_rates(records)
    acc_lines, derived = accuracy_rows(records)
    link_lines, summary = link_table(records, derived, rates, planner or {})
    spread_section, spread_summary, spread_derived = spread_lines(spread or [], rates, spread_planner or {})
    out = ["# Time to accuracy on learnable 300k- and 1M-node graphs, over an emulated cluster link", ""]
    out += answer(derived, summary + spread_summary, rates)
    out += ["Targets, GNNPipe's defaults (and, last, its option for deep models; seconds from each mode's latest "
            "quiet run, at 300k the latest session's; over all of the runs of the session before it, the first table's "
            "medians, GCNII-16's time to 99% is 0.70x and 0.68x at 300k and 0.71x at 1M):", "",
            *targets(derived, summary + spread_summary, spread_derived), ""]
    out += [bytes_bound(summary + spread_summary), ""]
    spread_acc = accuracy_sentences(spread_derived, defaults_only=True)
    if spread_acc:
        out += ["Accuracy on the spread graph ([below](#a-graph-whose-long-range-edges-touch-every-node)): "
                + "; ".join(spread_acc) + ".", ""]
    out += ["## Setup", "", *SETUP, ""]
    out += ["## The current code against the single process", "", *SINCE, ""]
    if pairs:
        out += ["### Alternating pairs, a later session", "", PAIRS_INTRO, "",
                *pair_lines(pairs, pair_epochs(derived), pair_epochs(spread_derived)), ""]
    out += ["## Over a link", "", *link_lines, ""]
    out += ["### Where the time goes", "", *time_split(summary), "", *FINDINGS, ""]
    out += [*planner_lines, ""] if planner_lines else []
    out += spread_section
    out += ["## Accuracy and time to it, free link", "", *accuracy_summary(derived), ""]
    out += ["Every GNNPipe run, 30 epochs: " + "; ".join(accuracy_sentences(derived)) + ".", ""]
    out += [*acc_lines, ""]
    out += ["## Rates", "", *rate_lines(rates, GPU_LINKS_GBIT, HBM_BYTES_PER_S, HBM_EFFICIENCY), ""]
    path.write_text("\n".join(out))


def bytes_bound(summary: List[dict]) -> str:
    """Why the bytes target is out of reach on the page's graph: the two modes' bytes per training step follow from
    the halo's size, which the pipeline cannot change."""
    def row(graph: str) -> Optional[dict]:
        return next((r for r in summary if r["graph"] == graph and r["model"] == "gcnii16" and r["sent"]["gnnpipe"]
                     and r["sent"]["graph_parallel"]), None)

    page, spread = row("page"), row("spread")
    measured = "" if page is None else (
        f" (measured: {page['sent']['graph_parallel'] / GIB:.2f} against {page['sent']['gnnpipe'] / GIB:.2f} GiB a "
        f"training step, {page['sent']['graph_parallel'] / page['sent']['gnnpipe']:.2f}x)")
    on_spread = "" if spread is None else (
        f"; the spread graph's halo of 0.81 |V| gives "
        f"{spread['sent']['graph_parallel'] / spread['sent']['gnnpipe']:.2f}x")
    return ("Bytes, and why the page's graph misses 5x: a GNNPipe training step sends every node's rows across its one "
            "stage boundary once forward and once back, 2 (S - 1) |V| d floats, and the last stage's logits; graph "
            "parallelism sends each partition's halo rows forward and their gradients back at every message-passing "
            "layer, 2 L |halo| d. With S = G = 2 their ratio is about L |halo| / |V|: on the page's graph the 2-way "
            "METIS halo holds 0.19 |V| rows, so GCNII-16's bound is about 3x" + measured + ", and 5x would need a halo "
            "of 0.31 |V| or more at 16 layers" + on_spread + ". GNNPipe already sends "
            "the least a 2-stage pipeline can (its halo rows' gradients stay on the stage that reads them); sending "
            "fewer would mean rounding the rows (e.g. to bfloat16), which it does not do silently.")


def targets(derived: Dict[tuple, dict], summary: List[dict], spread_derived: Dict[tuple, dict]) -> List[str]:
    """The issue's targets against the measured figures, per graph (every figure is read from the tables below)."""
    lines = ["| target | page's graph | spread graph |", "|---|---|---|"]

    def row_100(graph: str) -> Optional[dict]:  # GCNII-16 at the rate standing for 100 Gbit/s
        return next((r for r in summary if r["graph"] == graph and r["model"] == "gcnii16"
                     and "(= 100 Gbit/s" in r["name"]), None)

    def at_100(graph: str, key: str) -> str:
        row = row_100(graph)
        return "–" if row is None or row[key] is None else f"{row[key]:.2f}x"

    def sent_ratio(graph: str) -> str:
        row = row_100(graph)
        if row is None or not row["sent"]["gnnpipe"] or not row["sent"]["graph_parallel"]:
            return "–"
        return f"{row['sent']['graph_parallel'] / row['sent']['gnnpipe']:.2f}x"

    defaults = default_modes()

    def gaps(d: Dict[tuple, dict], which: Tuple[str, ...] = defaults) -> str:
        cells = []
        for (nodes, model, mode, seed), v in sorted(d.items()):
            exact = d.get((nodes, model, "exact", seed))
            if mode in which and exact and " (" not in model:
                cells.append(f"{model} {nodes // 1000:,}k seed {seed}: {(v['test'] - exact['test']) * 100:+.2f}")
        return "; ".join(cells) or "–"

    def tta(d: Dict[tuple, dict], which: Tuple[str, ...] = defaults) -> str:
        cells = [f"{model} {nodes // 1000:,}k seed {seed}: " + ("not reached" if v["ratio"] is None
                                                              else f"{v['ratio']:.2f}x")
                 for (nodes, model, mode, seed), v in sorted(d.items()) if mode in which and " (" not in model]
        return "; ".join(cells) or "–"

    def planner_hits(graph: str) -> str:
        rows = [r for r in summary if r["graph"] == graph and r["plan"] and r["faster_step"]]
        hits = [r for r in rows if r["train"].get(r["plan"]["choice"]) is not None
                and r["train"][r["plan"]["choice"]] <= 1.1 * r["train"][r["faster_step"]]]
        misses = [f"{r['model']} {r['name'].split(' (')[0]}" for r in rows if r not in hits]
        return f"{len(hits)} of {len(rows)}" + (f" (missed: {', '.join(misses)})" if misses else "")

    lines.append(f"| GP ÷ GNNPipe epoch at 100 Gbit/s, GCNII-16 (≥ 1.58x) | {at_100('page', 'ratio')} | "
                 f"{at_100('spread', 'ratio')} |")
    lines.append(f"| bytes GP ÷ GNNPipe (≥ 5x) | {sent_ratio('page')} | {sent_ratio('spread')} |")
    lines.append(f"| GNNPipe's s to 99% ÷ GP's at 100 Gbit/s, GCNII-16 (≤ 1 / 1.3 = 0.77x) | "
                 f"{at_100('page', 'acc_ratio')} | {at_100('spread', 'acc_ratio')} |")
    lines.append(f"| GNNPipe's test accuracy − exact's, defaults (within 0.5 points) | {gaps(derived)} | "
                 f"{gaps(spread_derived)} |")
    lines.append(f"| GNNPipe's s to 99% of exact's best val ÷ exact's, defaults (≤ 0.7x) | {tta(derived)} | "
                 f"{tta(spread_derived)} |")
    lines.append(f"| planner's training step within 10% of the faster, every rate | {planner_hits('page')} | "
                 f"{planner_hits('spread')} |")
    for strategy, name in (({"halo_gradients": "detach"}, "`GNNPipeStrategy(halo_gradients=\"detach\")` (the default "
                                                          "before `halo_gradients=\"auto\"`)"),
                           ({"refresh_every": 0}, "`GNNPipeStrategy(refresh_every=0)` (the default before "
                                                  "`refresh_every=\"auto\"`)")):
        old = (mode_key({"mode": "gnnpipe", "chunks": 8, "strategy": strategy}),)
        lines.append(f"| {name}: test accuracy − exact's (within 0.5 points) | {gaps(derived, old)} | "
                     f"{gaps(spread_derived, old)} |")
        lines.append(f"| {name}: s to 99% of exact's best val ÷ exact's (≤ 0.7x) | {tta(derived, old)} | "
                     f"{tta(spread_derived, old)} |")
    name = LABEL_EXACT_FORWARD
    lines.append(f"| {name}: GP ÷ GNNPipe epoch, s to 99% ÷ GP's, at 100 Gbit/s, GCNII-16 | "
                 f"{at_100('page', 'exact_forward_ratio')}, {at_100('page', 'exact_forward_acc_ratio')} | "
                 f"{at_100('spread', 'exact_forward_ratio')}, {at_100('spread', 'exact_forward_acc_ratio')} |")
    return lines


def answer(derived: Dict[tuple, dict], summary: List[dict], rates: Dict[int, dict]) -> List[str]:
    """The page's opening: per model and link, GNNPipe's epoch against graph parallelism's, bytes, planner; then
    accuracy and time to it against the exact single process. Every figure is read from the tables below."""
    out = ["**Answer.** Over a link: two 300,000-node, 6M-edge community graphs (the page's, whose long-range edges "
           "meet at a few connector nodes, and the spread graph, whose long-range edges touch every node), 2 "
           "processes on a 2-core CPU; epoch = training step + exact full-graph validation; link rates stand for "
           "GPUs joined by the named link (derivation at the end). Accuracy below it also at 1M nodes.", "",
           "| graph | model | link | GNNPipe s / epoch | graph parallel s / epoch | GP ÷ GNNPipe (≥ 1.58 at "
           "100 Gbit/s, "
           "16 layers) | bytes GP ÷ GNNPipe (≥ 5) | planner's choice (✓: its training step within 10% of the faster) | "
           "measured faster epoch |", "|---" * 9 + "|"]
    for row in summary:
        e, sent = row["epoch"], row["sent"]
        if not (e["gnnpipe"] and e["graph_parallel"]):
            continue
        ratio = sent["graph_parallel"] / sent["gnnpipe"] if sent["gnnpipe"] and sent["graph_parallel"] else None
        choice = "–" if row["plan"] is None else SHORT[row["plan"]["choice"]]
        train = row["train"]  # the planner estimates the training step: within 10% of the faster one, ✓
        picked = None if row["plan"] is None else train.get(row["plan"]["choice"])
        hit = "" if picked is None else (" ✓" if picked <= 1.1 * train[row["faster_step"]] else " ✗")
        out.append(f"| {GRAPHS[row['graph']]} | {row['model']} | {row['name']} | {e['gnnpipe']:.1f} | {e['graph_parallel']:.1f} | "
                   f"{row['ratio']:.2f}x | {'–' if ratio is None else f'{ratio:.2f}x'} | {choice}{hit} | "
                   f"{SHORT[row['fastest']]} |")
    out.append("")
    for graph, model in [(g, m) for g in GRAPHS for m in ("gcnii16", "ressage8")]:
        rows = [r for r in summary if r["model"] == model and r["graph"] == graph and r["ratio"]]
        wins = [f"{r['name'].split(' (')[0]} ({r['ratio']:.2f}x)" for r in rows if r["ratio"] > 1.0]
        loses = [f"{r['name'].split(' (')[0]} ({r['ratio']:.2f}x)" for r in rows if r["ratio"] <= 1.0]
        if rows:
            out.append(f"With {model} on the {GRAPHS[graph]}, GNNPipe's epoch is shorter than graph parallelism's on "
                       f"{', '.join(wins) or 'no link'}, and not on {', '.join(loses) or 'any other'} (GP ÷ GNNPipe).")
    out.append("")
    acc = accuracy_sentences(derived, defaults_only=True)
    mlp = {n: d for (n, m, mode, s), d in derived.items() if mode == "mlp"}
    if acc:
        out.append("Accuracy, free link, 30 epochs, GNNPipe's defaults (every option's run: [below]"
                   "(#accuracy-and-time-to-it-free-link)): " + "; ".join(acc) + "."
                   + (" The MLP on the node's own features reaches " + " and ".join(
                       f"{d['test']:.4f} ({n // 1000:,}k nodes)" for n, d in sorted(mlp.items()))
                      + ": the labels need the graph." if mlp else ""))
        out.append("")
    return out


def accuracy_sentences(derived: Dict[tuple, dict], defaults_only: bool = False) -> List[str]:
    """Per GNNPipe run (``defaults_only``: those of ``GNNPipeStrategy()``'s defaults): its test accuracy at the best
    validation epoch and time to 99% against exact's."""
    defaults = default_modes()
    acc = []
    for (nodes, model, mode, seed), d in sorted(derived.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][3],
                                                                                 mode_order(kv[0][2]))):
        exact = derived.get((nodes, model, "exact", seed))
        if not mode.startswith("gnnpipe") or exact is None or (defaults_only and mode not in defaults):
            continue
        gap = (d["test"] - exact["test"]) * 100
        ratio = "not reached" if d["ratio"] is None else f"in {d['ratio']:.2f}x exact's seconds"
        name = LABEL[mode].replace(" (2 processes)", "").replace(", K = 8", "")
        acc.append(f"{nodes // 1000:,}k nodes, {model}, seed {seed}, {name}: test accuracy {d['test']:.4f} against "
                   f"exact's {exact['test']:.4f} ({gap:+.2f} points; target within 0.5); 99% of exact's best "
                   "validation accuracy "
                   + (f"after {d['epochs']} epochs against {exact['epochs']}, {ratio}" if d["epochs"]
                      else "never reached") + " (target ≤ 0.7x)")
    return acc


def rate_lines(rates: Dict[int, dict], links, hbm: float, eff: float) -> List[str]:
    lines = ["| GPU link | model it is derived from | T_cpu: exact epoch, one core (s) | T_gpu: bytes at HBM (s) | "
             "emulated rate |", "|---|---|---|---|---|"]
    for gbit, r in sorted(rates.items()):
        lines.append(f"| {gbit} Gbit/s | {r['model']} | {r['cpu_s']:.2f} | {r['gpu_s'] * 1e3:.1f} ms | "
                     f"{r['rate_bits'] / 1e6:,.0f} Mbit/s |")
    return lines
