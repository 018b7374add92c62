"""Write docs/api.md from the public docstrings: ``python docs/make_api.py``."""

import inspect
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import lightning_gnnpipe as lg  # noqa: E402
from lightning_gnnpipe.comm.accounting import CommStats  # noqa: E402
from lightning_gnnpipe.planner.cost import (estimate_layouts, layout_plan, measure_bandwidth,  # noqa: E402
                                           measure_chunk_seconds, measure_layer_seconds)
from lightning_gnnpipe.planner.volume import graph_parallel_volume, hybrid_volume, pipeline_volume  # noqa: E402
from lightning_gnnpipe.data.partition import nested_partition  # noqa: E402
from lightning_gnnpipe.data.order import greedy_chunk_order, stale_read_stats  # noqa: E402
from lightning_gnnpipe.nn import NodeDropout, make_dropout, node_rows  # noqa: E402
from lightning_gnnpipe.nn.gcnii import GCNII  # noqa: E402
from lightning_gnnpipe.strategy.graph_parallel import GraphParallelStrategy  # noqa: E402
from lightning_gnnpipe.data.node_rows import NodeRows  # noqa: E402

OBJECTS = [lg.GNNPipeStrategy, GraphParallelStrategy, lg.GraphChunkDataModule, lg.GraphChunkDataModule.from_partitions,
           lg.partition_graph, NodeRows, lg.ChunkPlan, lg.build_chunk_plan,
           lg.metis_partition, greedy_chunk_order, stale_read_stats, lg.find_layer_stack, lg.History, GCNII,
           NodeDropout, node_rows, make_dropout,
           nested_partition, CommStats, pipeline_volume, graph_parallel_volume, hybrid_volume, estimate_layouts,
           layout_plan, measure_chunk_seconds, measure_layer_seconds, measure_bandwidth]


def render() -> str:
    """Return the text of docs/api.md generated from the docstrings of :data:`OBJECTS`."""
    lines = ["# API reference", "", "Generated from the docstrings by `python docs/make_api.py`.", ""]
    for obj in OBJECTS:
        target = obj.__init__ if inspect.isclass(obj) else obj
        try:
            sig = str(inspect.signature(target)).replace("(self, ", "(").replace("(self)", "()")
            sig = re.sub(r"<function (\w+) at 0x[0-9a-f]+>", r"\1", sig)  # same text on every run
        except (TypeError, ValueError):
            sig = "(...)"
        lines += [f"## `{obj.__module__}.{obj.__qualname__}`", "", "```python", f"{obj.__name__}{sig}", "```", "",
                  inspect.getdoc(obj) or "", ""]
    return "\n".join(lines)


def main() -> None:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "api.md")
    with open(path, "w") as f:
        f.write(render())


if __name__ == "__main__":
    main()
