"""``GraphParallelStrategy``: full-graph training with the graph cut across processes.

The baseline GNNPipe (arXiv 2308.10087, Sec. 2 and 6) is measured against: each of ``G``
processes owns one METIS part of the graph and runs *every* layer on its part; before each
message-passing layer it fetches its halo rows from their owners, and in the backward pass it
returns their gradients (:mod:`lightning_gnnpipe.comm.halo`). Weight gradients are summed over
the processes with one all-reduce, so training is exactly full-graph training: no staleness, no
dropped gradient paths. It reuses the GNNPipe strategy's Lightning plumbing, layer-stack
discovery, chunk-local edges and full-graph GCN normalisation, so both modes run the same kernels.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, List, Literal, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch import LightningModule, Trainer
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor, nn

from lightning_gnnpipe.comm.accounting import CommStats, log_comm
from lightning_gnnpipe.comm.gradients import all_reduce_grads
from lightning_gnnpipe.comm.halo import HaloPlan, build_halo_plan, exchange_halo
from lightning_gnnpipe.data.datamodule import GraphChunkDataModule
from lightning_gnnpipe.nn.dropout import node_rows
from lightning_gnnpipe.nn.feature_norm import check_feature_norms
from lightning_gnnpipe.nn.normalization import check_supported, normalized_convs, precomputed_norm
from lightning_gnnpipe.nn.stack import LayerStack, find_layer_stack, uses_graph
from lightning_gnnpipe.pipeline.graph import ChunkGraph, build_chunk_graph
from lightning_gnnpipe.pipeline.loss import output_grad
from lightning_gnnpipe.strategy.gnnpipe import GNNPipeStrategy
from lightning_gnnpipe.strategy.state import broadcast_blocks


class PartitionForward(nn.Module):
    """All layers of the model on one part of the graph, with a halo exchange per layer.

    Args:
        blocks: The model's ``L`` layer blocks (shared with the user's module, not copied).
        graph: Chunk-local graphs of the partition (chunk ``r`` = part ``r``).
        part: This rank's part ``r``.
        halo: This rank's :class:`~lightning_gnnpipe.comm.halo.HaloPlan`.
        x: Node features of the whole graph ``(|V|, F)``; layer 0 reads its halo rows here.

    Shapes:
        ``forward()`` -> ``(n_r, C)``: the output rows of this part's nodes.
    """

    def __init__(self, blocks: List[nn.Module], graph: ChunkGraph, part: int, halo: HaloPlan, x: Tensor) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.graph, self.part, self.halo, self.x = graph, part, halo, x
        self._uses_graph = [uses_graph(b) for b in blocks]
        self._norm_convs = [normalized_convs(b) for b in blocks]
        self._rows = torch.cat([graph.nodes[part], graph.halo[part]])  # global id of each row of a block's input

    def forward(self, stats: Optional[CommStats] = None, group=None, epoch: int = 0) -> Tensor:
        """This part's output rows ``(n_r, C)``; ``epoch`` keys :class:`~lightning_gnnpipe.nn.NodeDropout`'s masks."""
        g, r = self.graph, self.part
        h = self.x[g.nodes[r]]
        n = h.size(0)
        first = True  # h still holds the input features, whose halo rows every rank has
        for j, block in enumerate(self.blocks):
            if not self._uses_graph[j]:
                with node_rows(g.nodes[r], epoch):
                    h = block(h, g.edge_index[r][:, :0])
                first = False
                continue
            halo_rows = self.x[g.halo[r]] if first else exchange_halo(h, self.halo, stats, group)
            with precomputed_norm(self._norm_convs[j], g.norm_edges[r]), node_rows(self._rows, epoch):
                h = block(torch.cat([h, halo_rows.to(h.dtype)]), g.edge_index[r])[:n]
            first = False
        return h


class GraphParallelStrategy(GNNPipeStrategy):
    """Train a GNN with the graph partitioned over the processes (graph parallelism).

    Process ``r`` of ``G = devices`` owns part ``r`` of the DataModule's chunk plan, which must
    have ``num_chunks = G``: ``GraphChunkDataModule(data, num_chunks=G)``. Every layer exchanges
    halo embeddings (forward) and halo gradients (backward) with ``all_to_all_single``; the
    parts' outputs are all-gathered so the user's unchanged ``training_step`` sees the
    full-graph logits on every rank; ``dL/dlogits`` is backpropagated through each rank's own
    rows; weight gradients are summed with one all-reduce. The result equals single-device
    full-graph training (up to float summation order). Traffic is counted in
    :attr:`comm_stats` and logged as ``comm/...`` every epoch.

    Args:
        timeout: Timeout of every collective. Default 600 s.
        start_method: ``"spawn"`` (default) or ``"popen"``.
        process_group_backend: ``"gloo"`` (CPU default) or ``"nccl"``.
        **kwargs: Further :class:`~lightning_gnnpipe.GNNPipeStrategy` arguments (``schedule`` and
            ``refresh_on_start`` are fixed here).

    Raises:
        TypeError: No ``GraphChunkDataModule`` or no splittable layer stack.
        ValueError: The DataModule's ``num_chunks`` differs from the number of processes, a multi-hop
            conv or a graph-wide norm layer (before any process starts), a bad ``start_method`` or precision.
        RuntimeError: The ranks built different chunk plans, or ``training_step``'s loss does not depend
            on the model's output (at the first step).
    """

    strategy_name = "graph_parallel"
    _sharded_gradients = False  # gradients are all-reduced: the local norm is the global norm

    def __init__(
        self,
        timeout: timedelta = timedelta(seconds=600),
        start_method: Literal["spawn", "popen"] = "spawn",
        process_group_backend: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(schedule="gpipe", refresh_on_start=False, timeout=timeout, start_method=start_method,
                         process_group_backend=process_group_backend, **kwargs)
        self._forward: Optional[PartitionForward] = None

    @property
    def num_parts(self) -> int:
        """``G``: one graph part per process."""
        return self.num_nodes * self.num_processes

    def rank_location(self) -> str:
        """This rank's place, named in error notes: ``"rank r (partition r of G)"``."""
        return f"rank {self.global_rank} (partition {self.global_rank} of {self.num_parts})"

    def check(self, trainer: Trainer, module: Optional[LightningModule] = None, datamodule: Any = None) -> LayerStack:
        """Validate model and DataModule before any process group starts.

        Arguments and return value as :meth:`GNNPipeStrategy.check <lightning_gnnpipe.GNNPipeStrategy.check>`.

        Raises:
            TypeError: No ``GraphChunkDataModule`` or no splittable layer stack.
            ValueError: ``num_chunks`` differs from the number of processes, a multi-hop conv or a
                graph-wide norm layer.
        """
        module = module if module is not None else trainer.lightning_module
        datamodule = datamodule if datamodule is not None else trainer.datamodule
        if not isinstance(datamodule, GraphChunkDataModule):
            raise TypeError(
                "GraphParallelStrategy: pass the graph as `datamodule=GraphChunkDataModule(data, num_chunks=G)` "
                f"(got datamodule={type(datamodule).__name__}). The strategy needs its partition."
            )
        if datamodule.num_chunks != self.num_parts:
            raise ValueError(
                f"GraphParallelStrategy: the DataModule's `num_chunks` must equal the number of processes "
                f"{self.num_parts}, one graph part per process (got num_chunks={datamodule.num_chunks}). "
                f"Use GraphChunkDataModule(data, num_chunks={self.num_parts})."
            )
        stack = find_layer_stack(module)
        check_supported(stack.blocks)
        check_feature_norms(stack.blocks, unit="partition")
        return stack

    def _build(self, trainer: Trainer) -> None:
        stack, plan, data, x = self._prepare(trainer)
        device = self.root_device
        graph = build_chunk_graph(plan, data.edge_index, stack.blocks, device, dtype=x.dtype)
        r = self.global_rank
        broadcast_blocks(stack.blocks, src=0)  # every part starts from rank 0's weights and NodeDropout seeds
        self._forward = PartitionForward(stack.blocks, graph, r, build_halo_plan(plan, r).to(device), x)
        self._nodes = graph.nodes
        self._rows = plan.max_chunk_size
        self._num_nodes_graph = plan.num_nodes
        self._params = list(dict.fromkeys(p for b in stack.blocks for p in b.parameters() if p.requires_grad))

    def refresh_history(self) -> None:
        """No history tables: graph parallelism is exact."""

    # ------------------------------------------------------------------ collectives
    def _gather_logits(self, out: Tensor, stats: Optional[CommStats]) -> Tensor:
        """All-gather every part's output rows into the full ``(|V|, C)`` logits on every rank."""
        padded = F.pad(out.detach(), (0, 0, 0, self._rows - out.size(0))).contiguous()
        blocks = [torch.empty_like(padded) for _ in range(self.num_parts)]
        if stats is None:
            dist.all_gather(blocks, padded)
        else:
            with stats.waiting():
                dist.all_gather(blocks, padded)
            stats.record_all_gather("logits", padded, self.num_parts)
        full = padded.new_empty(self._num_nodes_graph, padded.size(1))
        for q, nodes in enumerate(self._nodes):
            full[nodes] = blocks[q][: nodes.numel()]
        return full

    # ------------------------------------------------------------------ steps
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        assert self._forward is not None and self._stack is not None
        lm, batch, stats = self.lightning_module, args[0], self.comm_stats
        for p in lm.parameters():
            p.grad = None
        stats.reset()
        t0 = time.perf_counter()
        with self.precision_plugin.train_step_context():
            out = self._forward(stats, epoch=lm.trainer.current_epoch)
            logits = self._gather_logits(out, stats)
            grad, output = output_grad(lambda full: self._user_loss(full, batch, args, kwargs), logits)
            out.backward(grad[self._nodes[self.global_rank]])
            all_reduce_grads(self._params, stats, self.num_parts)
        stats.step_s = time.perf_counter() - t0
        self.comm_metrics = log_comm(lm, stats)
        self._grads = [(p, p.grad) for p in lm.parameters() if p.grad is not None]
        return apply_to_collection(output, Tensor, lambda t: t.detach())

    def _send_recv_full(self, h: Optional[Tensor], write_history: bool) -> Tensor:
        """Exact full-graph forward (no grad); the logits ``(|V|, C)`` on every rank."""
        assert self._forward is not None
        with torch.no_grad():
            return self._gather_logits(self._forward(None), None)

    def teardown(self) -> None:
        self._forward = None
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(cls.strategy_name, cls, description="Graph-parallel full-graph GNN training")
