"""A history refresh run the graph-parallel way: every rank computes at once, each table's rows go to its stage.

An exact refresh (:mod:`~lightning_gnnpipe.history.lifecycle`) writes the exact input of every layer ``l >= 1`` with a
message-passing block into the table that layer's stage keeps. The pipelined forward computes the stages one after
the other, all nodes at a time. Where the evaluation runs graph-parallel
(:class:`~lightning_gnnpipe.strategy.graph_parallel_eval.GraphParallelEvaluation`: each of the ``S`` ranks computes
every layer for one part of the nodes, all at once), the refresh runs in that forward too: before each such layer,
every rank sends the input rows of its part's table nodes to the rank of the layer's stage (one
``all_to_all_single``), which writes them and its own part's rows into the table. The tables then hold the same rows
as after a pipelined refresh (the same blocks on the same exact inputs), and the drift of each layer is summed over
the parts. Bytes: each table's rows once, ``R_l x d_l`` per layer (``R_l``: the table's rows, about ``(S - 1) / S`` of
them cross), against ``|V| x d`` per stage boundary for the pipelined forward. One partition per stage only
(``G = 1``).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lightning_gnnpipe.data.chunk import ChunkPlan
from lightning_gnnpipe.history.history import History
from lightning_gnnpipe.pipeline.stage import boundary_nodes


def table_nodes(plan: ChunkPlan) -> Optional[Tensor]:
    """The nodes whose rows a stage's tables keep when the stage holds every chunk ``(R,)``, or ``None`` (every node):
    :func:`~lightning_gnnpipe.pipeline.stage.boundary_nodes` of all chunks' halos."""
    return boundary_nodes(list(plan.halo), plan.num_nodes)


class TableRefresh:
    """What the graph-parallel forward needs to refill the history tables: hook it on each layer's input rows.

    Args:
        stages: This rank's stages (their ``histories``: layer -> :class:`~lightning_gnnpipe.history.history.History`).
        owner: Per layer with a table, the position of the rank whose stage keeps it.
        parts: The graph-parallel evaluation's parts (one per rank: ``parts.nodes[r]``, the nodes whose rows rank
            ``r`` computes, in its row order).
        plan: The chunk plan (its halos name the tables' rows, :func:`table_nodes`).
        position: This rank's position; ``group``: the ranks' process group.
        drift: Receives, for each table of this rank, ``(||old - exact||^2, ||exact||^2)`` over its rows.

    Raises:
        RuntimeError: A table of this rank keeps other rows than :func:`table_nodes` names (its stage does not hold
            every chunk).
    """

    def __init__(self, stages: Sequence[nn.Module], owner: Dict[int, int], parts: ChunkPlan, plan: ChunkPlan,
                 position: int, group, drift: Dict[int, Tuple[float, float]]) -> None:
        self.tables: Dict[int, History] = {int(k): t for s in stages for k, t in s.histories.items()}
        self.owner, self.position, self.group, self.drift = owner, position, group, drift
        nodes = table_nodes(plan)
        for layer, table in self.tables.items():
            kept = table.emb.size(0) if table.node_ids is None else int(table.node_ids.numel())
            if kept != (plan.num_nodes if nodes is None else int(nodes.numel())):
                raise RuntimeError(f"TableRefresh: layer {layer}'s table keeps {kept} rows, not the "
                                   f"{plan.num_nodes if nodes is None else int(nodes.numel())} boundary rows of a "
                                   "stage that holds every chunk; refresh it with the pipelined forward.")
        member = None
        if nodes is not None:
            member = torch.zeros(plan.num_nodes, dtype=torch.bool, device=nodes.device)
            member[nodes] = True
        # per part: positions of its table rows among its rows, and their node ids
        self.rows: List[Tuple[Tensor, Tensor]] = []
        for ids in parts.nodes:
            at = torch.arange(ids.numel(), device=ids.device) if member is None else member[ids].nonzero().view(-1)
            self.rows.append((at, ids[at]))

    def __call__(self, layer: int, h: Tensor) -> None:
        """Send this part's input rows ``h`` ``(n_r, d)`` of ``layer``'s table nodes to the table's rank; there, write
        every part's rows (a collective over the group: every rank calls it for the same layers)."""
        if self.rows and self.rows[0][0].device != h.device:  # the plan's ids live on the CPU
            self.rows = [(at.to(h.device), ids.to(h.device)) for at, ids in self.rows]
        owner, me, d = self.owner[layer], self.position, h.size(1)
        sizes = [int(at.numel()) * d for at, _ in self.rows]
        send = h.index_select(0, self.rows[me][0]) if me != owner else h.new_empty(0, d)
        send_splits = [sizes[me] if r == owner and me != owner else 0 for r in range(len(self.rows))]
        recv_splits = [sizes[r] if me == owner and r != owner else 0 for r in range(len(self.rows))]
        recv = h.new_empty(sum(recv_splits))
        dist.all_to_all_single(recv, send.reshape(-1).contiguous(), recv_splits, send_splits, group=self.group)
        if me != owner:
            return
        table = self.tables[layer]
        at, ids = self.rows[me]
        diff, norm = table.refresh_rows(ids, h.index_select(0, at))
        for r, piece in enumerate(recv.split(recv_splits)):
            if r != me and piece.numel():
                sq = table.refresh_rows(self.rows[r][1], piece.view(-1, d))
                diff, norm = diff + sq[0], norm + sq[1]
        self.drift[layer] = (diff, norm)
