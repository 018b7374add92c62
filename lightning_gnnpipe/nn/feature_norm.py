"""Feature normalisation layers inside pipeline blocks: which ones a chunk computes exactly.

A stage runs every block on one chunk's rows (its inner nodes and their halo), never on the
whole graph at once. A layer that works on each node's row alone (``torch.nn.LayerNorm``,
PyG ``LayerNorm(mode="node")``) is therefore exact. A layer that computes statistics over
the rows it is given sees only the chunk's rows:

* batch statistics in training, running statistics in evaluation (``BatchNorm``,
  ``DiffGroupNorm``): training normalises per chunk, evaluation is exact. Allowed, with a
  warning.
* statistics over the given rows in training *and* evaluation (PyG ``LayerNorm(mode="graph")``,
  ``GraphNorm``, ``PairNorm``, ``InstanceNorm``, ``MeanSubtractionNorm``, ``GraphSizeNorm``):
  even the evaluation output depends on how the graph was cut. Refused.
"""

from __future__ import annotations

from typing import List

from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import nn
from torch_geometric.nn import norm as pyg_norm

from lightning_gnnpipe._compat import BatchNormBase, InstanceNormBase

PER_CHUNK_IN_TRAINING = (BatchNormBase, pyg_norm.BatchNorm, pyg_norm.HeteroBatchNorm, pyg_norm.DiffGroupNorm)
"""Normalise with chunk statistics in training, with running statistics in evaluation."""

PER_CHUNK_ALWAYS = (
    InstanceNormBase, pyg_norm.InstanceNorm, pyg_norm.GraphNorm, pyg_norm.PairNorm,
    pyg_norm.MeanSubtractionNorm, pyg_norm.GraphSizeNorm,
)
"""Normalise with statistics of the rows they are given, in training and evaluation."""


def _graph_wide(m: nn.Module) -> bool:
    if isinstance(m, pyg_norm.LayerNorm):
        return m.mode == "graph"
    return isinstance(m, PER_CHUNK_ALWAYS)


_UNITS = {  # unit -> (strategy, who gives the block its rows, how the graph is cut)
    "chunk": ("GNNPipeStrategy", "a stage", "chunking"),
    "partition": ("GraphParallelStrategy", "each process", "partitioning"),
}


def check_feature_norms(blocks: List[nn.Module], unit: str = "chunk") -> None:
    """Refuse normalisation layers whose output depends on the chunking; warn about BatchNorm.

    Graph parallelism runs every block on one partition's rows (inner and halo), as a stage does on one
    chunk's, so the same layers are refused or warned about there.

    Args:
        blocks: The model's ``L`` layer blocks.
        unit: ``"chunk"`` (GNNPipe, the default) or ``"partition"`` (graph parallelism): the rows a
            block is given, named in the messages.

    Raises:
        ValueError: If a block holds a layer that normalises over all the rows it is given
            in evaluation too (PyG ``LayerNorm(mode="graph")``, ``GraphNorm``, ``PairNorm``,
            ``InstanceNorm``, ``MeanSubtractionNorm``, ``GraphSizeNorm``).
    """
    strategy, giver, cut = _UNITS[unit]
    warned = False
    for i, block in enumerate(blocks):
        for m in block.modules():
            name = type(m).__name__
            if _graph_wide(m):
                mode = f"(mode={m.mode!r})" if isinstance(m, pyg_norm.LayerNorm) else ""
                raise ValueError(
                    f"{strategy}: layer {i} holds {name}{mode}, which normalises over all the rows it "
                    f"is given; {giver} gives it one {unit}'s rows, so even evaluation would depend on the "
                    f"{cut} (got {name}{mode} in {type(block).__name__}). Use a per-node norm: "
                    "torch.nn.LayerNorm, PyG LayerNorm(mode='node') (BasicGNN: "
                    "norm='layer_norm', norm_kwargs={'mode': 'node'}) or BatchNorm."
                )
            if isinstance(m, PER_CHUNK_IN_TRAINING) and not warned:
                warned = True  # once: a PyG BatchNorm also holds a torch BatchNorm1d
                rank_zero_warn(
                    f"{strategy}: layer {i} holds {name}; in training its statistics are computed per "
                    f"{unit} (over the {unit}'s inner and halo rows), not over the whole graph, so training "
                    "differs from full-graph training. Validation, test and predict use the running "
                    "statistics and are exact. Use torch.nn.LayerNorm for exact training.",
                    category=UserWarning,
                )
