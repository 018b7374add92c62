"""Choosing a layout: analytic communication volumes and a cost model over layouts (S, G, K)."""

from lightning_gnnpipe.planner.cost import LayoutEstimate, estimate_layouts, format_table, layout_plan, recommend
from lightning_gnnpipe.planner.volume import graph_parallel_volume, hybrid_volume, pipeline_volume

__all__ = [
    "LayoutEstimate", "estimate_layouts", "format_table", "graph_parallel_volume", "hybrid_volume", "layout_plan",
    "pipeline_volume", "recommend",
]
