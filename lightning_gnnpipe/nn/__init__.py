"""Adapters that make PyG models splittable into stages, and chunk-aware layers."""

from lightning_gnnpipe.nn.dropout import NodeDropout, node_rows

__all__ = ["NodeDropout", "node_rows"]
