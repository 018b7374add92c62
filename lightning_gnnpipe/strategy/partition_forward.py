"""One partition's forward through every layer, with a halo exchange before each message-passing layer.

Graph parallelism (e.g. DistGNN, arXiv 2104.06700; the baseline of GNNPipe, arXiv 2308.10087, Sec. 2): each of
``G`` ranks owns one part of the graph and runs every layer on it. Before a message-passing layer it fetches its
halo rows from their owners (:class:`~lightning_gnnpipe.comm.exchange.RowExchange`, one ``all_to_all_single``),
and in the backward pass returns their gradients, so training is exactly full-graph training.
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_gnnpipe.comm.accounting import CommStats
from lightning_gnnpipe.comm.exchange import RowExchange, SlotPlan, halo_rows
from lightning_gnnpipe.data.chunk_graph import ChunkGraph
from lightning_gnnpipe.nn.dropout import node_rows
from lightning_gnnpipe.nn.chunk_call import ChunkCaller
from lightning_gnnpipe.nn.stack import call_block, takes_x0, uses_graph


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
        self._carry_x0 = any(takes_x0(b) for b in blocks)  # GCNII: block 0's output goes to every later block

    def forward(self, stats: Optional[CommStats] = None, group=None, epoch: int = 0) -> Tensor:
        """This part's output rows ``(n_r, C)``; ``epoch`` keys :class:`~lightning_gnnpipe.nn.NodeDropout`'s masks.

        ``group``: the exchange's process group (default: the one given at construction).
        """
        g, r = self.graph, self.part
        group = group if group is not None else self.group
        h = self.x[g.nodes[r]]
        n = h.size(0)
        h0: Optional[Tensor] = None  # block 0's output rows of this part, when some block takes x0
        first = True  # h still holds the input features, whose halo rows every rank has
        for j, block in enumerate(self.blocks):
            if not self._uses_graph[j]:
                with node_rows(g.nodes[r], epoch):
                    h = call_block(block, h, g.edge_index[r][:, :0], h0)
            else:
                if first:
                    halo = self.x[g.halo[r]]
                else:
                    halo = halo_rows(RowExchange.apply(h, self.exchange, stats, group), self.exchange,
                                     g.halo[r].numel())
                x_local = torch.cat([h, halo.to(h.dtype)])
                # x0 of the halo rows never reaches an inner output (a GCNII layer mixes it in row by row): zeros
                x0 = None if h0 is None else F.pad(h0, (0, 0, 0, x_local.size(0) - n))
                h = self._callers[j](x_local, r, self._rows, epoch, x0)[:n]
            if j == 0 and self._carry_x0:
                h0 = h
            first = False
        return h
