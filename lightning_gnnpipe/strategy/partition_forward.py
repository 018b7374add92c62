"""One partition's forward through every layer, with a halo exchange before each message-passing layer.

Graph parallelism (e.g. DistGNN, arXiv 2104.06700; the baseline of GNNPipe, arXiv 2308.10087, Sec. 2): each of
``G`` ranks owns one part of the graph and runs every layer on it. Before a message-passing layer it fetches its
halo rows from their owners (:class:`~lightning_gnnpipe.comm.exchange.RowExchange`, one ``all_to_all_single``),
and in the backward pass returns their gradients, so training is exactly full-graph training.
"""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor, nn

from lightning_gnnpipe.comm.accounting import CommStats
from lightning_gnnpipe.comm.exchange import RowExchange, SlotPlan, halo_rows
from lightning_gnnpipe.data.chunk_graph import ChunkGraph
from lightning_gnnpipe.nn.dropout import node_rows
from lightning_gnnpipe.nn.chunk_call import ChunkCaller
from lightning_gnnpipe.nn.stack import uses_graph


class PartitionForward(nn.Module):
    """All layers of the model on one part of the graph, with a halo exchange per layer.

    Args:
        blocks: The model's ``L`` layer blocks (shared with the user's module, not copied).
        graph: Chunk-local graphs of the partition (chunk ``r`` = part ``r``).
        part: This rank's part ``r``.
        exchange: This rank's :class:`~lightning_gnnpipe.comm.exchange.SlotPlan` (one slot: every halo row live).
        x: Node features of the whole graph ``(|V|, F)``; layer 0 reads its halo rows here.
        group: Process group of the halo exchange (default: the world).

    Shapes:
        ``forward()`` -> ``(n_r, C)``: the output rows of this part's nodes.
    """

    def __init__(self, blocks: List[nn.Module], graph: ChunkGraph, part: int, exchange: SlotPlan, x: Tensor,
                 group=None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.graph, self.part, self.exchange, self.x, self.group = graph, part, exchange, x, group
        self._uses_graph = [uses_graph(b) for b in blocks]
        self._callers = [ChunkCaller(b, graph) for b in blocks]  # sparse adjacency or edge list, per block
        self._rows = torch.cat([graph.nodes[part], graph.halo[part]])  # global id of each row of a block's input

    def forward(self, stats: Optional[CommStats] = None, group=None, epoch: int = 0) -> Tensor:
        """This part's output rows ``(n_r, C)``; ``epoch`` keys :class:`~lightning_gnnpipe.nn.NodeDropout`'s masks.

        ``group``: the exchange's process group (default: the one given at construction).
        """
        g, r = self.graph, self.part
        group = group if group is not None else self.group
        h = self.x[g.nodes[r]]
        n = h.size(0)
        first = True  # h still holds the input features, whose halo rows every rank has
        for j, block in enumerate(self.blocks):
            if not self._uses_graph[j]:
                with node_rows(g.nodes[r], epoch):
                    h = block(h, g.edge_index[r][:, :0])
                first = False
                continue
            if first:
                halo = self.x[g.halo[r]]
            else:
                halo = halo_rows(RowExchange.apply(h, self.exchange, stats, group), self.exchange, g.halo[r].numel())
            h = self._callers[j](torch.cat([h, halo.to(h.dtype)]), r, self._rows, epoch)[:n]
            first = False
        return h
