"""``GraphParallelStrategy``: full-graph training with the graph cut across processes.

The baseline GNNPipe (arXiv 2308.10087, Sec. 2 and 6) is measured against: each of ``G``
processes owns one METIS part of the graph and runs *every* layer on its part
(:class:`~lightning_gnnpipe.strategy.partition_forward.PartitionForward`); before each message-passing layer it
fetches its halo rows from their owners, and in the backward pass it returns their gradients
(:mod:`lightning_gnnpipe.comm.partitions`). Weight gradients are summed over the processes with one all-reduce, so
training is exactly full-graph training: no staleness, no dropped gradient paths. It shares the Lightning plumbing
with :class:`~lightning_gnnpipe.GNNPipeStrategy` (:class:`~lightning_gnnpipe.strategy.base.WholeGraphStrategy`),
and the layer-stack discovery, chunk-local edges and full-graph GCN normalisation, so both modes run the same
kernels.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch import LightningModule, Trainer
from torch import Tensor

from lightning_gnnpipe.comm.accounting import CommStats
from lightning_gnnpipe.comm.partitions import PartitionExchange
from lightning_gnnpipe.data.chunk_graph import build_chunk_graph
from lightning_gnnpipe.data.datamodule import GraphChunkDataModule
from lightning_gnnpipe.nn.feature_norm import check_feature_norms
from lightning_gnnpipe.nn.chunk_call import chunk_graph_options
from lightning_gnnpipe.nn.gcn_norm import check_one_hop, norm_keys
from lightning_gnnpipe.nn.stack import LayerStack, find_layer_stack
from lightning_gnnpipe.pipeline.loss import output_grad
from lightning_gnnpipe.strategy.base import WholeGraphStrategy
from lightning_gnnpipe.strategy.checks import check_lightning_usage
from lightning_gnnpipe.strategy.gnnpipe import GNNPipeStrategy
from lightning_gnnpipe.strategy.partition_forward import PartitionForward
from lightning_gnnpipe.strategy.user_loss import run_training_step


class GraphParallelStrategy(WholeGraphStrategy):
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
        **kwargs: ``timeout`` (of every collective, default 600 s), ``exchange_timeout`` (of the halo exchanges,
            gradient sums and gathers, default 120 s), ``start_method`` (``"spawn"`` or ``"popen"``),
            ``process_group_backend`` (``"gloo"`` or ``"nccl"``), ``profile_epoch``, ``trace_dir``,
            ``heap_mmap_threshold``, ``huge_pages``: as
            :class:`~lightning_gnnpipe.strategy.base.WholeGraphStrategy`. No other option: graph parallelism has
            no stages, schedule or history tables.

    Raises:
        TypeError: An option of :class:`~lightning_gnnpipe.GNNPipeStrategy` (at construction); no
            ``GraphChunkDataModule`` or no splittable layer stack.
        ValueError: The DataModule's ``num_chunks`` differs from the number of processes, a multi-hop
            conv or a graph-wide norm layer (before any process starts), a bad ``start_method`` or precision.
        RuntimeError: The ranks built different chunk plans, or ``training_step``'s loss does not depend
            on the model's output (at the first step).
    """

    strategy_name = "graph_parallel"

    def __init__(self, **kwargs: Any) -> None:
        pipeline_only = sorted(set(kwargs) & set(inspect.signature(GNNPipeStrategy).parameters))
        if pipeline_only:
            raise TypeError(
                f"GraphParallelStrategy: {', '.join(f'`{k}`' for k in pipeline_only)} is an option of GNNPipeStrategy; "
                f"graph parallelism has no stages, schedule or history tables (got "
                f"{', '.join(f'{k}={kwargs[k]!r}' for k in pipeline_only)}). Leave it out, or use GNNPipeStrategy."
            )
        # Gradients are all-reduced, so the local norm is the global norm: Lightning's clipping is right as is.
        super().__init__(**kwargs)
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

        Args:
            trainer: The ``Trainer``.
            module: The LightningModule (default: the trainer's).
            datamodule: The DataModule (default: the trainer's).

        Returns:
            The model's layer stack.

        Raises:
            TypeError: No ``GraphChunkDataModule`` or no splittable layer stack.
            ValueError: ``num_chunks`` differs from the number of processes, ``chunks_per_step`` below it (several
                steps an epoch), a multi-hop conv or a graph-wide norm layer.
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
        if datamodule.partitions is not None and datamodule.num_parts != self.num_parts:
            raise ValueError(
                f"GraphParallelStrategy: each of the {self.num_parts} processes loads one partition, but "
                f"{datamodule.partitions.path} holds num_parts={datamodule.num_parts}. Partition it again with "
                f"`lightning-gnnpipe partition --num-parts {self.num_parts} --num-chunks {self.num_parts}`."
            )
        if datamodule.steps_per_epoch > 1:
            raise ValueError(
                "GraphParallelStrategy: every training step is an exact full-graph step, one partition per process, "
                f"so the DataModule must run all its chunks in one step (got chunks_per_step="
                f"{datamodule.chunks_per_step} of num_chunks={datamodule.num_chunks}). Leave chunks_per_step=None, "
                "or train several steps an epoch with GNNPipeStrategy."
            )
        stack = find_layer_stack(module)
        check_one_hop(stack.blocks)
        check_feature_norms(stack.blocks, unit="partition")
        check_lightning_usage(trainer, module, stack, "GraphParallelStrategy")
        return stack

    def _build(self, trainer: Trainer) -> None:
        stack, plan, data, x = self._prepare(trainer)
        device = self.root_device
        r = self.global_rank
        graph = build_chunk_graph(plan, data.edge_index, norm_keys(stack.blocks), device, dtype=x.dtype, chunks=[r],
                                  **chunk_graph_options(stack.blocks, autocast=self._boundary_dtype != x.dtype))
        # one slot (K = G): every halo row live; every rank of the world, with the exchange timeout
        partitions = PartitionExchange(plan, self.num_parts, r, self.exchange_group, self.comm_stats, device)
        partitions.broadcast(stack.blocks)  # every part starts from rank 0's weights and dropout seeds
        self._forward = PartitionForward(stack.blocks, graph, partitions, x)
        self._nodes = graph.nodes
        self._rows = plan.max_chunk_size
        self._params = list(dict.fromkeys(p for b in stack.blocks for p in b.parameters() if p.requires_grad))

    # ------------------------------------------------------------------ collectives
    def kept_bytes(self) -> Tuple[int, int]:
        """``(0, chunk graph bytes)``: graph parallelism keeps no history tables."""
        return 0, self._forward.graph.nbytes() if self._forward is not None else 0

    def _gather_logits(self, out: Tensor, stats: Optional[CommStats]) -> Tensor:
        """All-gather every part's output rows into the full ``(|V|, C)`` logits on every rank."""
        padded = F.pad(out.detach(), (0, 0, 0, self._rows - out.size(0))).contiguous()
        blocks = [torch.empty_like(padded) for _ in range(self.num_parts)]
        if stats is None:
            dist.all_gather(blocks, padded, group=self.exchange_group)
        else:
            with stats.waiting():
                dist.all_gather(blocks, padded, group=self.exchange_group)
            stats.record_all_gather("logits", padded, self.num_parts)
        full = padded.new_empty(self._num_nodes_graph, padded.size(1))
        for q, nodes in enumerate(self._nodes):
            full[nodes] = blocks[q][: nodes.numel()]
        return full

    # ------------------------------------------------------------------ steps
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        assert self._forward is not None and self._stack is not None
        lm, batch, stats = self.lightning_module, args[0], self.comm_stats
        self._begin_step()
        stats.reset()
        t0 = stats.clock.mark()  # CUDA events on a GPU: the step's kernels, not their launches
        with self.precision_plugin.train_step_context():
            out = self._forward(epoch=lm.trainer.current_epoch)
            logits = self._gather_logits(out, stats)
            grad, output = output_grad(lambda full: run_training_step(lm, self._stack.module, full, batch, args,
                                                                      kwargs), logits)
            out.backward(grad[self._nodes[self.global_rank]])
            self._forward.partitions.sum_grads(self._params)
        end = stats.clock.mark()
        stats.clock.wait()
        stats.settle()
        stats.step_s = stats.clock.seconds(t0, end)
        self.comm_metrics = self._log_comm()
        return self._end_step(output)

    def full_logits(self) -> Tensor:
        """Exact full-graph forward (no grad); the logits ``(|V|, C)`` on every rank."""
        assert self._forward is not None
        with torch.no_grad(), self._forward.partitions.uncounted():
            return self._gather_logits(self._forward(), None)

    def teardown(self) -> None:
        self._forward = None
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(cls.strategy_name, cls, description="Graph-parallel full-graph GNN training")
