"""One partition's forward through every layer, with a halo exchange before each message-passing layer.

Graph parallelism (e.g. DistGNN, arXiv 2104.06700; the baseline of GNNPipe, arXiv 2308.10087, Sec. 2): each of
``G`` ranks owns one part of the graph and runs every layer on it. Before a message-passing layer it fetches its
halo rows from their owners (:class:`~lightning_gnnpipe.comm.partitions.PartitionExchange`: one
``all_to_all_single``), and in the backward pass returns their gradients, so training is exactly full-graph training.
The loop over the blocks is :class:`~lightning_gnnpipe.nn.chunk_runner.ChunkRunner`'s, the one a pipeline stage runs;
a part is its one chunk (``K = G``).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

from torch import Tensor, nn

from lightning_gnnpipe.comm.partitions import PartitionExchange
from lightning_gnnpipe.data.chunk_graph import ChunkGraph
from lightning_gnnpipe.nn.chunk_runner import ChunkRunner
from lightning_gnnpipe.nn.stack import takes_x0


class PartitionForward(nn.Module):
    """All layers of the model on one part of the graph, with a halo exchange per layer.

    Args:
        blocks: The model's ``L`` layer blocks (shared with the user's module, not copied).
        graph: Chunk-local graphs of the partition (chunk ``r`` = part ``r``).
        partitions: This rank's part ``r`` of ``G`` and its exchange (one slot: every halo row live). Bytes are
            counted in its ``stats`` (use :meth:`~lightning_gnnpipe.comm.partitions.PartitionExchange.uncounted`
            for evaluation).
        x: Node features of the whole graph ``(|V|, F)``; layer 0 reads its halo rows here.

    Attributes:
        on_layer_input: Called ``(layer, h)`` with this part's input rows ``(n_r, d)`` of every message-passing layer
            ``>= 1``, before its halo exchange (a graph-parallel history refresh); ``None`` by default.

    Shapes:
        ``forward()`` -> ``(n_r, C)``: the output rows of this part's nodes.
    """

    def __init__(self, blocks: List[nn.Module], graph: ChunkGraph, partitions: PartitionExchange, x: Tensor) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.graph, self.partitions, self.part = graph, partitions, partitions.index
        self.runner = ChunkRunner(blocks, list(range(len(blocks))), graph, x=x, chunks=[self.part],
                                  carry_x0=any(takes_x0(b) for b in blocks))
        self.on_layer_input: Optional[Callable[[int, Tensor], None]] = None  # (layer, this part's input rows)

    def forward(self, epoch: int = 0) -> Tensor:
        """This part's output rows ``(n_r, C)``; ``epoch`` keys :class:`~lightning_gnnpipe.nn.NodeDropout`'s masks."""
        r = self.part
        h, _ = self.runner.run(self.runner.x[self.graph.nodes[r]], None, r, epoch, self._fill_halo)
        return h

    def _fill_halo(self, layer: int, h: Tensor, c: int, out: Tensor) -> Tuple[Tensor, None]:
        """Every halo row of ``layer`` comes from its owner part, live (gradients go back)."""
        if self.on_layer_input is not None:
            self.on_layer_input(layer, h)
        self.partitions.halo_into(h, c, self.graph.halo[c], out)
        return h, None
