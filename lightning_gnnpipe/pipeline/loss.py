"""The last stage's per-micro-batch loss, built from the user's own loss.

The schedules call ``loss_fn(output_mb, target_mb)`` right after each chunk's forward on the
last stage and later backpropagate what it returns. Three modes:

* ``"deferred"`` (GPipe): the user's ``training_step`` needs the whole graph's output, which
  exists only after the last chunk's forward. Every chunk returns a zero-valued proxy whose
  backward supplies ``dL/d(out_c)``; after the last forward the outputs are assembled into a
  leaf ``(|V|, C)``, the user's loss is evaluated on it once and differentiated. GPipe runs
  every forward before any backward, so the gradients exist when the proxies need them.
  Exact for any loss.
* ``"separable"`` (1F1B and other schedules that interleave backwards, with a loss that passed
  :func:`~lightning_gnnpipe.pipeline.separable.probe_row_separable`): right after chunk ``c``'s forward the user's
  loss is evaluated on a full ``(|V|, C)`` output holding chunk ``c``'s live rows and, elsewhere, detached
  placeholders (the latest rows of the other chunks: this step's for earlier chunks, the last step's for later
  ones). Its gradient on chunk ``c``'s rows does not depend on the placeholders, so backpropagating it gives
  ``dL/d(out_c)`` exactly. The loss runs ``K`` times per step (the strategy silences logging in those calls).
* ``"chunk"`` (the same schedules): the LightningModule's ``pipeline_chunk_loss(out, batch, node_index)``
  returns chunk ``c``'s part of the loss; the parts must add up to the full-graph loss.

All modes use ``scale_grads=False``: the full-graph loss is already normalised by the
global number of labelled nodes, so ``K = 1`` and ``K > 1`` get the same gradient scale.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import torch
from torch import Tensor

from lightning_gnnpipe.data.chunk_graph import ChunkGraph


def labelled_chunks(batch: Any, nodes: List[Tensor]) -> List[bool]:
    """Return, per chunk, whether ``batch.train_mask`` selects any of its ``nodes`` (all ``True`` without a mask).

    One host read for all chunks (not one device sync per chunk). A chunk without training nodes still runs forward
    and backward (the pipeline needs every micro-batch), but its loss term is exactly zero instead of the user
    hook's result, which is NaN for a mean over no nodes.
    """
    mask = getattr(batch, "train_mask", None)
    if not isinstance(mask, Tensor):
        return [True] * len(nodes)
    return torch.stack([mask[n.to(mask.device)].any() for n in nodes]).tolist()


class _DeferredOutputGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out: Tensor, holder: "PipelineLoss", c: int) -> Tensor:  # type: ignore[override]
        ctx.holder, ctx.c = holder, c
        return out.new_zeros(())

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        return ctx.holder.output_grad(ctx.c) * grad, None, None


FullLoss = Callable[[Tensor], Tuple[Tensor, Any]]
ChunkLoss = Callable[[Tensor, int], Tensor]


def output_grad(full_loss: FullLoss, logits: Tensor) -> Tuple[Tensor, Any]:
    """Evaluate the user's loss on the full-graph ``logits`` and return ``(dL/dlogits, output)``.

    Shapes:
        ``logits`` ``(|V|, C)`` (detached); the gradient has the same shape.

    Raises:
        RuntimeError: If the loss does not depend on ``logits``.
    """
    full = logits.detach().requires_grad_(True)
    with torch.enable_grad():
        loss, output = full_loss(full)
        if not isinstance(loss, Tensor) or not loss.requires_grad:
            raise RuntimeError(
                "GNNPipeStrategy: `training_step` returned a loss that does not depend on the model "
                f"output (got {type(loss).__name__}). Return the loss computed from `self(x, edge_index)`."
            )
        (grad,) = torch.autograd.grad(loss, full)
    return grad, output


class PipelineLoss:
    """Loss callable for the last stage, collecting every chunk's output.

    Args:
        graph: Chunk-local graph (for the inner node ids).
        num_nodes: ``|V|``.
        mode: ``"deferred"``, ``"separable"`` or ``"chunk"``.
        chunks: The chunks this pipeline runs (default: all). Hybrid parallelism: partition ``g``'s.
        gather: Hybrid parallelism: turns this pipeline's ``(|V|, C)`` logits (zero outside its chunks)
            into the whole graph's (a sum over the last stages of all pipelines), called once per step.

    Shapes:
        ``__call__``: ``out`` ``(M, C)``, ``target`` ``(1,)`` holding the chunk id.
    """

    def __init__(self, graph: ChunkGraph, num_nodes: int, mode: str, chunks: Optional[List[int]] = None,
                 gather: Optional[Callable[[Tensor], Tensor]] = None) -> None:
        self.graph, self.num_nodes, self.mode = graph, num_nodes, mode
        self.chunks = list(range(graph.num_chunks)) if chunks is None else list(chunks)
        self.gather = gather
        self.full_loss: Optional[FullLoss] = None
        self.chunk_loss: Optional[ChunkLoss] = None
        self._rows: Optional[Tensor] = None  # separable: the latest (|V|, C) output rows, kept across steps
        self.reset()

    def reset(self, full_loss: Optional[FullLoss] = None, chunk_loss: Optional[ChunkLoss] = None,
              chunks: Optional[List[int]] = None) -> None:
        """Start a new step with the loss closures for this batch; ``chunks``: the chunks this pipeline runs in the
        step (default: all of :attr:`chunks`; fewer with several steps an epoch)."""
        self.full_loss, self.chunk_loss = full_loss, chunk_loss
        self.step_chunks = list(self.chunks if chunks is None else chunks)
        self.outputs: List[Optional[Tensor]] = [None] * self.graph.num_chunks
        self._grad: Optional[Tensor] = None
        self._logits: Optional[Tensor] = None
        self.step_output: Any = None

    def __call__(self, out: Tensor, target: Tensor) -> Tensor:
        c = int(target.reshape(-1)[0])
        n = self.graph.nodes[c].numel()
        self.outputs[c] = out[:n].detach()
        if self.mode == "chunk":
            assert self.chunk_loss is not None
            return self.chunk_loss(out[:n], c)
        if self.mode == "separable":
            assert self.full_loss is not None
            rows = self._latest_rows(out)
            rows[self.graph.nodes[c]] = out[:n].detach()
            loss, _ = self.full_loss(rows.index_put((self.graph.nodes[c],), out[:n]))  # only chunk c's rows live
            return loss
        if all(self.outputs[k] is not None for k in self.step_chunks):
            self._finish()
        return _DeferredOutputGrad.apply(out, self, c)

    def _latest_rows(self, out: Tensor) -> Tensor:
        """The ``(|V|, C)`` buffer of the latest output rows (zeros outside this pipeline's chunks)."""
        if self._rows is None or self._rows.dtype != out.dtype:
            self._rows = out.new_zeros(self.num_nodes, out.size(-1))
        return self._rows

    def logits(self) -> Tensor:
        """Assemble the step's chunks' outputs into ``(|V|, C)`` (detached; zero on the rows of chunks outside the
        step); gathered once per step if hybrid."""
        if self._logits is not None:
            return self._logits
        missing = [c for c in self.step_chunks if self.outputs[c] is None]
        if missing:
            raise RuntimeError(f"PipelineLoss: chunk {missing[0]} produced no output in this step.")
        first = self.outputs[self.step_chunks[0]]
        full = first.new_zeros(self.num_nodes, first.size(-1))
        for c in self.step_chunks:
            full[self.graph.nodes[c]] = self.outputs[c]
        self._logits = self.gather(full) if self.gather is not None else full
        return self._logits

    def _finish(self) -> None:
        assert self.full_loss is not None
        self._grad, self.step_output = output_grad(self.full_loss, self.logits())

    def output_grad(self, c: int) -> Tensor:
        """Return ``dL/d(out_c)`` padded to ``(M, C)``."""
        if self._grad is None:
            raise RuntimeError(
                "GNNPipeStrategy: a backward ran before the last chunk's forward. The 'deferred' loss "
                "needs schedule 'gpipe'; other schedules need `pipeline_chunk_loss` on the module."
            )
        g = self._grad[self.graph.nodes[c]]
        return torch.nn.functional.pad(g, (0, 0, 0, self.graph.max_chunk_size - g.size(0)))
