"""One pipeline stage: consecutive layer blocks, their history tables, and both forwards.

GNNPipe (arXiv 2308.10087, Sec. 4): a stage owns layers ``[l_s, l_{s+1})``. For each chunk
it receives the chunk's own rows ``(M, d)`` (padded), and for each owned layer it

1. writes the chunk's rows into that layer's history table (fresh for later chunks),
2. reads the halo rows from the table (fresh if the halo's chunk came earlier in this
   epoch, historical otherwise), detached,
3. runs the block on ``[inner; halo]`` and keeps the inner rows.

The loop over the blocks is :class:`~lightning_gnnpipe.nn.chunk_runner.ChunkRunner`'s, shared with graph
parallelism; this module adds what GNNPipe adds: the history tables that fill the halo rows. Under hybrid
parallelism the stage's :class:`~lightning_gnnpipe.comm.partitions.PartitionExchange` also sends and receives the
rows of the other partitions (with ``G = 1`` it does nothing).

The first layer reads its halo rows straight from the node features, which never go stale.
Only the chunk's own rows leave the stage, padded back to ``M`` rows. Every block call declares
the global node id of each row and the epoch (:func:`~lightning_gnnpipe.nn.node_rows`), so that
:class:`~lightning_gnnpipe.nn.NodeDropout` drops a halo row exactly as its owner chunk does.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_gnnpipe.comm.partitions import PartitionExchange
from lightning_gnnpipe.data.chunk_graph import ChunkGraph
from lightning_gnnpipe.history.halo_grad import HaloGradients, check_halo_gradients
from lightning_gnnpipe.history.history import History
from lightning_gnnpipe.nn.chunk_runner import ChunkRunner, HaloGrad
from lightning_gnnpipe.nn.stack import takes_x0

BOUNDARY_ROWS = 0.9
"""Tables keep rows for the boundary nodes alone (a row map) when they are at most this fraction of ``|V|``: on real
graphs cut by METIS few nodes are another chunk's halo (Cora, K = 8: 25%; CiteSeer: 8%); above it the map costs
more than it saves."""

STAGE_ERROR = "_gnnpipe_stage_index"
"""Attribute set on an exception raised inside :meth:`GNNStage.forward`: the (virtual) stage index."""


class GNNStage(nn.Module):
    """The stage module given to :class:`torch.distributed.pipelining.PipelineStage`.

    Args:
        blocks: This stage's layer blocks (the user's modules, shared, not copied).
        layer_ids: Global index of each block, consecutive.
        dims: Feature width entering each of the model's ``L`` layers and leaving the last,
            ``L + 1`` ints.
        graph: Chunk-local graph structure.
        x: Node features ``(|V|, F)``; needed by the stage that owns layer 0, else ``None``.
        history_momentum: Moving-average momentum of the history tables (0: plain overwrite).
        history_dtype: Dtype of the history tables (default: torch's default dtype); rows read from them are cast
            to the embeddings' dtype.
        halo_gradients: ``"detach"`` drops the gradient that reaches halo rows (GNNAutoScale);
            ``"stale"`` applies it to the owner chunk one epoch later (PipeGCN); ``"fresh"`` in the same epoch where
            the owner's backward comes later (the rows read historical), else drops it; the runtime reverses the
            chunk order in odd epochs (``history/halo_grad.py``).
        carry_x0: Whether some block of the model takes the initial embedding ``x0``.
        x0_block: Block 0 on this rank, when every stage computes ``x0`` from the features itself instead of sending
            it (:mod:`~lightning_gnnpipe.pipeline.initial_embedding`); then ``x`` is needed here too.
        activation_checkpointing: Recompute each block's forward in the backward pass
            (``torch.utils.checkpoint``): between a chunk's forward and backward the stage keeps only every
            block's input ``(n_c + h_c, d)``, not the block's intermediate tensors. Results are identical.
        partitions: This stage's graph partition and its exchanges with the other partitions' ranks
            (:class:`~lightning_gnnpipe.comm.partitions.PartitionExchange`; default: one partition, no exchange).
            The stage runs that partition's chunks only. With ``G > 1`` (hybrid parallelism; needs
            ``halo_gradients="detach"``) its tables hold the rows of those chunks and their halos, and
            :meth:`forward_full` receives the halo rows from the other partitions after each layer; with ``G = 1`` a table holds rows for the boundary nodes
            only (the nodes in some chunk's halo: the only rows ever read) when they are at most
            :data:`BOUNDARY_ROWS` of ``|V|``.
        stage_index: The (virtual) stage index, recorded on errors raised in :meth:`forward` (:data:`STAGE_ERROR`).

    Raises:
        ValueError: ``halo_gradients`` unknown, ``"stale"`` with ``G > 1``, or layer 0 or ``x0_block`` here without
            ``x``.
        RuntimeError: The partition exchange delivers rows this stage keeps no table row for.

    Shapes:
        forward: ``h`` ``(M, dims[l_s])`` -> ``(M, dims[l_{s+1}])``; ``chunk_id`` ``(1,)``. The first stage ignores
        ``h`` (any shape; the pipeline passes one placeholder row) and reads its chunk's rows of ``x``. When a
        block takes ``x0`` (GCNII), the initial embedding ``h0`` ``(M, dims[1])`` (block 0's
        output) travels beside ``h``: every stage but the first also receives it and every stage
        but the last also returns it; not with ``x0_block``.
    """

    def __init__(
        self,
        blocks: List[nn.Module],
        layer_ids: List[int],
        dims: List[int],
        graph: ChunkGraph,
        x: Optional[Tensor] = None,
        history_momentum: float = 0.0,
        history_dtype: Optional[torch.dtype] = None,
        halo_gradients: str = "detach",
        carry_x0: bool = False,
        x0_block: Optional[nn.Module] = None,
        activation_checkpointing: bool = False,
        partitions: Optional[PartitionExchange] = None,
        stage_index: int = 0,
    ) -> None:
        super().__init__()
        self.stage_index = stage_index
        check_halo_gradients(halo_gradients, "GNNStage")
        self.partitions = partitions if partitions is not None else PartitionExchange()
        if self.partitions.size > 1 and halo_gradients != "detach":
            raise ValueError(f"GNNStage: `halo_gradients={halo_gradients!r}` is not supported with hybrid parallelism "
                             f"({self.partitions.size} partitions). Use 'detach'.")
        if (0 in layer_ids or x0_block is not None) and x is None:
            raise ValueError("GNNStage: the stage that owns layer 0, or computes `x0` with `x0_block`, needs the node "
                             "features `x` (got None).")
        self.blocks = nn.ModuleList(blocks)
        self.layer_ids = list(layer_ids)
        self.graph = graph
        self.x = x
        self.in_channels = dims[layer_ids[0]]
        self.out_channels = dims[layer_ids[-1] + 1]
        self.carry_x0 = carry_x0
        self.x0_channels = dims[1]
        self.is_first, self.is_last = layer_ids[0] == 0, layer_ids[-1] == len(dims) - 2
        self.sends_x0 = carry_x0 and x0_block is None  # x0 crosses the boundaries (else each stage computes it)
        # kept outside the module tree: block 0 belongs to stage 0, this stage's parameters() must not list it
        self._x0_block = [x0_block] if carry_x0 and not self.is_first and any(takes_x0(b) for b in blocks) else []
        self.epoch = 0  # keys NodeDropout's masks (next_epoch)
        self.chunks = self.partitions.chunks(graph.num_chunks)
        self.runner = ChunkRunner(blocks, layer_ids, graph, x=x, chunks=self.chunks, carry_x0=carry_x0,
                                  activation_checkpointing=activation_checkpointing)
        num_nodes = sum(int(n.numel()) for n in graph.nodes)
        rows: Dict[str, Tensor] = {}
        self._pushed: List[Optional[Tensor]] = [None] * graph.num_chunks  # per chunk: its rows that have a table row
        ids = self.partitions.table_rows(graph, self.chunks)
        if ids is not None:  # hybrid: rows of this partition's chunks and of their halos only
            rows = _row_map(ids, num_nodes)
        else:  # only boundary nodes (some chunk's halo) are ever read from a table: keep rows for them alone
            ids = boundary_nodes([graph.halo[c] for c in self.chunks], num_nodes)
            if ids is not None:
                rows = _row_map(ids, num_nodes)
                for c in self.chunks:
                    self._pushed[c] = (rows["row_of"][graph.nodes[c]] >= 0).nonzero().view(-1)
        self.histories = nn.ModuleDict()
        self.halo_grads = nn.ModuleDict()
        device = graph.nodes[0].device
        for j, layer in enumerate(self.layer_ids):
            if layer > 0 and self.runner.uses_graph[j]:
                self.histories[str(layer)] = History(num_nodes, dims[layer], device=device, momentum=history_momentum,
                                                     dtype=history_dtype, **rows)
                if halo_gradients != "detach":
                    self.halo_grads[str(layer)] = HaloGradients(num_nodes, dims[layer], device=device,
                                                                fresh=halo_gradients == "fresh",
                                                                row_of=rows.get("row_of"))

    @property
    def input_widths(self) -> List[int]:
        """Width of each tensor this stage receives (``h``, then ``h0`` when carried)."""
        return [self.in_channels] + ([self.x0_channels] if self.sends_x0 and not self.is_first else [])

    @property
    def output_widths(self) -> List[int]:
        """Width of each tensor this stage returns (``h``, then ``h0`` when carried)."""
        return [self.out_channels] + ([self.x0_channels] if self.sends_x0 and not self.is_last else [])

    def _outputs(self, h: Tensor, h0: Optional[Tensor], rows: int):
        pad = lambda t: F.pad(t, (0, 0, 0, rows - t.size(0)))  # noqa: E731
        if self.sends_x0 and not self.is_last:
            return pad(h), pad(h0)
        return pad(h)

    def forward(self, h: Tensor, *carried: Tensor, chunk_id: Tensor):
        """Run chunk ``chunk_id`` through this stage's layers (training micro-batch).

        An exception raised here gets the attribute :data:`STAGE_ERROR` (this stage's index), so that the
        strategy can find it under the ``RuntimeError`` torch's pipelining stage wraps it in.
        """
        try:
            c = int(chunk_id.reshape(-1)[0])
            n = self.graph.nodes[c].numel()
            h = self.x[self.graph.nodes[c]] if self.is_first else h[:n]  # the first stage's input: a placeholder
            h0 = carried[0][:n] if carried else self._x0(self.graph.nodes[c])
            h, h0 = self.runner.run(h, h0, c, self.epoch, self._fill_halo)
            return self._outputs(h, h0, self.graph.max_chunk_size)
        except Exception as exc:
            try:
                setattr(exc, STAGE_ERROR, self.stage_index)
            except AttributeError:  # exceptions with __slots__
                pass
            raise

    def _x0(self, ids: Tensor) -> Optional[Tensor]:
        """``x0`` ``(len(ids), dims[1])`` of nodes ``ids``, computed here with ``x0_block`` (else ``None``)."""
        return self.runner.node_wise_block(self._x0_block[0], self.x[ids], ids, self.epoch) if self._x0_block else None

    def _fill_halo(self, layer: int, h: Tensor, c: int, out: Tensor) -> Tuple[Tensor, Optional[HaloGrad]]:
        """GNNPipe's halo rows of ``layer`` for chunk ``c`` (:data:`~lightning_gnnpipe.nn.chunk_runner.HaloFill`).

        The chunk's own rows ``h`` ``(n_c, d)`` go into the layer's table first (fresh for the chunks after it); the
        halo rows ``out`` ``(h_c, d)`` are then read from the table, or under hybrid parallelism partly received live
        from the other partitions. With stale or fresh halo gradients the halo rows' gradient is collected per node
        and ``h``'s backward adds what was collected for its rows.
        """
        nodes, halo = self.graph.nodes[c], self.graph.halo[c]
        table = self.histories[str(layer)]
        pushed = self._pushed[c]  # None: all of the chunk's rows
        table.push(nodes, h) if pushed is None else table.push(nodes[pushed], h[pushed])
        self.partitions.halo_into(h, c, halo, out, table)
        if str(layer) in self.halo_grads:  # stale or fresh halo gradients (one partition only)
            grads = self.halo_grads[str(layer)]
            h = grads.apply(h, nodes) if pushed is None else grads.apply(h, nodes[pushed], pushed)
            return h, grads.collector(halo)
        return h, None

    def next_epoch(self, epoch: Optional[int] = None) -> None:
        """Start a training epoch: last epoch's collected halo gradients become the ones applied.

        Args:
            epoch: The epoch that starts (keys :class:`~lightning_gnnpipe.nn.NodeDropout`'s masks); ``None``
                counts one more than the last.
        """
        self.epoch = self.epoch + 1 if epoch is None else int(epoch)
        for grads in self.halo_grads.values():
            grads.next_epoch()

    @torch.no_grad()
    def forward_full(self, h: Tensor, *carried: Tensor, write_history: bool = False,
                     drift: Optional[Dict[int, Tuple[float, float]]] = None,
                     chunk_order: Tuple[bool, bool] = (False, False)):
        """Compute this stage's layers exactly for the whole graph, layer by layer.

        Every layer sees fresh inputs for all nodes (no historical rows), so stacking the
        stages gives the unsplit model's output. With ``write_history`` the inputs are also
        written into the tables (an exact history refresh).

        Args:
            h: Input embeddings of all nodes ``(|V|, dims[l_s])`` (``x`` for the first stage).
            carried: ``h0`` ``(|V|, dims[1])`` when the model carries it and this is not the first stage.
            write_history: Whether to refill the history tables.
            drift: If given (with ``write_history``), receives each refreshed layer's ``||old - exact||^2`` and
                ``||exact||^2`` over its table's rows, before the refresh (:func:`~lightning_gnnpipe.history.history.drift_of`).
            chunk_order: Whether the inputs come, and the outputs leave, with their rows in the chunk order of this
                stage's plan instead of node order (between stages of one plan, :meth:`~lightning_gnnpipe.nn.
                chunk_runner.ChunkRunner.run_full`); only with one partition.

        Returns:
            Output embeddings of all nodes ``(|V|, dims[l_{s+1}])`` (and ``h0`` when carried).
        """
        def refresh(layer: int, inputs: Tensor, position: Optional[Tensor]) -> None:
            if write_history and str(layer) in self.histories:
                d = self.histories[str(layer)].refresh(inputs, position)
                if drift is not None:
                    drift[layer] = d

        # every partition computes its own chunks' rows and receives its halo's from their owners before the next
        # layer (no-op with one partition); the last stage's result is then gathered whole
        # x0 computed here comes in the order of the rows: the plan's chunk order when they come so
        ids = self.runner.chunk_order()[0] if chunk_order[0] else torch.arange(h.size(0), device=h.device)
        h0 = carried[0] if carried else self._x0(ids)
        h, h0 = self.runner.run_full(h, h0, self.epoch, before_layer=refresh,
                                     combine=self.partitions.share_halo_rows, chunk_order=chunk_order)
        if self.is_last:
            h = self.partitions.gather_rows(h)
        return self._outputs(h, h0, h.size(0))


def boundary_nodes(halos: List[Tensor], num_nodes: int) -> Optional[Tensor]:
    """The nodes a stage's tables keep rows for: those of the chunks' halos ``(R,)``, sorted, or ``None`` (every node)
    when they are more than :data:`BOUNDARY_ROWS` of ``num_nodes``. Raises nothing."""
    ids = torch.cat(halos).unique()
    return ids if ids.numel() <= BOUNDARY_ROWS * num_nodes else None


def _row_map(ids: Tensor, num_nodes: int) -> Dict[str, Tensor]:
    """Table rows for the sorted global ids ``ids`` only: ``node_ids`` and ``row_of`` (``-1``: no row)."""
    row_of = torch.full((num_nodes,), -1, dtype=torch.long, device=ids.device)
    row_of[ids] = torch.arange(ids.numel(), device=ids.device)
    return {"node_ids": ids, "row_of": row_of}
