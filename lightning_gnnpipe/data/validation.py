"""Checks on a user's graph, run before any process group starts.

Every message has the shape ``<where>: <what is wrong> (got <value>). <how to fix>.``
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.data import Data

_WHERE = "GraphChunkDataModule"
MASKS = ("train_mask", "val_mask", "test_mask")


def validate_graph(data: Data) -> None:
    """Raise a clear error if ``data`` cannot be trained on as one full graph.

    Checks ``edge_index`` (dtype, shape, id range), ``x`` (present, 2-D, finite), ``y`` and the
    masks (length ``|V|``, boolean), and that the training mask selects labelled nodes only
    (labels ``< 0`` mean unlabelled).

    Raises:
        TypeError: If ``data`` is not a ``Data`` or a tensor has the wrong dtype.
        ValueError: If a shape, an id or a value is wrong.
    """
    if not isinstance(data, Data):
        raise TypeError(f"{_WHERE}: `data` must be a torch_geometric.data.Data (got {type(data).__name__}).")
    ei = data.edge_index
    if not isinstance(ei, Tensor):
        raise TypeError(f"{_WHERE}: `data.edge_index` must be a tensor (got {type(ei).__name__}).")
    if ei.dtype != torch.long:
        raise TypeError(
            f"{_WHERE}: `data.edge_index` must have dtype torch.long (got {ei.dtype}). "
            "Use `data.edge_index = data.edge_index.long()`."
        )
    if ei.dim() != 2 or ei.size(0) != 2:
        raise ValueError(
            f"{_WHERE}: `data.edge_index` must have shape (2, num_edges) (got {tuple(ei.shape)}). "
            "Transpose a (num_edges, 2) list with `.t().contiguous()`."
        )
    x = data.x
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise ValueError(
            f"{_WHERE}: `data.x` must be a node feature matrix of shape (num_nodes, F) "
            f"(got {None if x is None else tuple(x.shape)})."
        )
    n = x.size(0)
    if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= n):
        raise ValueError(
            f"{_WHERE}: `data.edge_index` holds node ids outside [0, {n}) "
            f"(got min {int(ei.min())}, max {int(ei.max())}). Every id must index a row of `data.x`."
        )
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).any(dim=1).sum())
        raise ValueError(
            f"{_WHERE}: `data.x` contains NaN or Inf (got {bad} bad rows). Clean or impute the features."
        )
    y = getattr(data, "y", None)
    if y is not None and (not isinstance(y, Tensor) or y.size(0) != n):
        raise ValueError(
            f"{_WHERE}: `data.y` must have one entry per node, {n} (got "
            f"{None if not isinstance(y, Tensor) else y.size(0)})."
        )
    for name in MASKS:
        mask = getattr(data, name, None)
        if mask is None:
            continue
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise TypeError(
                f"{_WHERE}: `data.{name}` must be a torch.bool tensor (got "
                f"{getattr(mask, 'dtype', type(mask).__name__)}). Use `index_to_mask`."
            )
        if mask.dim() != 1 or mask.size(0) != n:
            raise ValueError(
                f"{_WHERE}: `data.{name}` must have shape ({n},) (got {tuple(mask.shape)}). "
                "Select one split of a multi-split mask, e.g. `data.train_mask[:, 0]`."
            )
        if not bool(mask.any()):
            raise ValueError(f"{_WHERE}: `data.{name}` selects no node (got 0 of {n}). Give it labelled nodes.")
        if y is not None and not y.is_floating_point() and bool((y[mask] < 0).any()):
            raise ValueError(
                f"{_WHERE}: `data.{name}` selects unlabelled nodes (y < 0) (got "
                f"{int((y[mask] < 0).sum())} of {int(mask.sum())}). Remove them from the mask."
            )


def validate_num_chunks(num_chunks: object, num_nodes: int) -> int:
    """Return ``num_chunks`` if it is an int in ``[1, num_nodes]``, else raise."""
    if isinstance(num_chunks, bool) or not isinstance(num_chunks, int):
        raise TypeError(f"{_WHERE}: `num_chunks` must be an int (got {type(num_chunks).__name__}).")
    if not 1 <= num_chunks <= num_nodes:
        raise ValueError(
            f"{_WHERE}: `num_chunks` must be in [1, {num_nodes}] (the number of nodes) "
            f"(got {num_chunks}). Use fewer chunks."
        )
    return num_chunks


def validate_num_parts(num_parts: object, num_chunks: int) -> int:
    """Return ``num_parts`` if it is an int ``>= 1`` that divides ``num_chunks``, else raise.

    Raises:
        TypeError: If ``num_parts`` is not an int.
        ValueError: If it is below 1 or does not divide ``num_chunks``.
    """
    if isinstance(num_parts, bool) or not isinstance(num_parts, int):
        raise TypeError(f"{_WHERE}: `num_parts` must be an int (got {type(num_parts).__name__}).")
    if num_parts < 1 or num_chunks % num_parts:
        raise ValueError(
            f"{_WHERE}: `num_parts` must be >= 1 and divide `num_chunks` ({num_chunks}) (got {num_parts}). "
            "Every partition gets num_chunks / num_parts chunks; e.g. num_chunks=8, num_parts=2."
        )
    return num_parts


def validate_part(part: object, num_nodes: int, num_chunks: int) -> None:
    """Check a user-given chunk assignment: ``(|V|,)`` long ids in ``[0, K)``, no empty chunk.

    Raises:
        TypeError: If ``part`` is not a ``torch.long`` tensor.
        ValueError: If its shape or values are wrong, or a chunk gets no node.
    """
    if not isinstance(part, Tensor) or part.dtype != torch.long:
        raise TypeError(
            f"{_WHERE}: `part` must be a torch.long tensor of chunk ids (got "
            f"{getattr(part, 'dtype', type(part).__name__)}). Use `part.long()`."
        )
    if part.dim() != 1 or part.size(0) != num_nodes:
        raise ValueError(f"{_WHERE}: `part` must have shape ({num_nodes},) (got {tuple(part.shape)}).")
    if int(part.min()) < 0 or int(part.max()) >= num_chunks:
        raise ValueError(
            f"{_WHERE}: `part` holds chunk ids outside [0, {num_chunks}) (got min {int(part.min())}, max "
            f"{int(part.max())}). Ids must be 0 .. num_chunks - 1."
        )
    sizes = torch.bincount(part, minlength=num_chunks)
    if bool((sizes == 0).any()):
        raise ValueError(
            f"{_WHERE}: `part` leaves chunks without nodes (got empty chunks "
            f"{(sizes == 0).nonzero().view(-1).tolist()}). Every chunk needs at least one node; use fewer "
            "chunks or leave `part=None` (METIS, empty parts refilled)."
        )
