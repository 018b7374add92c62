"""Adapters that make PyG models splittable into stages, and chunk-aware layers."""

from lightning_gnnpipe.nn.dropout import NodeDropout, make_dropout, node_rows

__all__ = ["NodeDropout", "make_dropout", "node_rows"]
