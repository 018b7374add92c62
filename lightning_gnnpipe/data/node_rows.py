"""``NodeRows``: the feature rows of some nodes of a graph, read by global node id.

A rank that loads one partition of a partitioned graph (:mod:`~lightning_gnnpipe.data.partitioned`) holds the
features of its partition's nodes and their halo only, not ``|V| x F``. The stages read features by global node id
(``x[ids]``, ``torch.index_select(x, 0, ids)``); :class:`NodeRows` answers those reads from its own rows through a
map from global id to row, and raises a clear error on an id it does not hold. A full feature matrix stays an
ordinary tensor everywhere: :func:`select_rows` and :func:`select_rows_into` take either.
"""

from __future__ import annotations

from typing import Any, Tuple, Union

import torch
from torch import Tensor


class NodeRows:
    """Feature rows of the nodes ``ids`` of a graph of ``num_nodes`` nodes.

    Args:
        ids: Global ids of the rows held, sorted, ``(n,)``, ``torch.long``.
        values: Their features ``(n, F)``, row ``i`` for node ``ids[i]``.
        num_nodes: ``|V|`` of the whole graph.

    Memory: the rows, plus a map from global id to row of ``4 |V|`` bytes (``int32``).

    Raises:
        ValueError: ``ids`` and ``values`` differ in length.
    """

    def __init__(self, ids: Tensor, values: Tensor, num_nodes: int, _row: Tensor = None) -> None:
        if ids.numel() != values.size(0):
            raise ValueError(f"NodeRows: {ids.numel()} ids for {values.size(0)} rows of features; give one id a row.")
        self.ids, self.values, self.num_nodes = ids, values, int(num_nodes)
        if _row is None:
            _row = torch.full((self.num_nodes,), -1, dtype=torch.int32, device=values.device)
            _row[ids.to(values.device)] = torch.arange(ids.numel(), dtype=torch.int32, device=values.device)
        self._row = _row

    # what the stages ask of a feature matrix
    @property
    def shape(self) -> torch.Size:
        """``(|V|, F)``: the shape of the whole graph's feature matrix these rows belong to."""
        return torch.Size((self.num_nodes,) + tuple(self.values.shape[1:]))

    def size(self, dim: Union[int, None] = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return self.values.dim()

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        return self.values.device

    def new_zeros(self, *args: Any, **kwargs: Any) -> Tensor:
        return self.values.new_zeros(*args, **kwargs)

    def new_empty(self, *args: Any, **kwargs: Any) -> Tensor:
        return self.values.new_empty(*args, **kwargs)

    def to(self, *args: Any, **kwargs: Any) -> "NodeRows":
        values = self.values.to(*args, **kwargs)
        if values is self.values:
            return self
        return NodeRows(self.ids, values, self.num_nodes, _row=self._row.to(values.device))

    def rows(self, ids: Tensor) -> Tensor:
        """The row of every global id in ``ids`` (any shape), ``torch.long``.

        Raises:
            IndexError: A node whose features these rows do not hold.
        """
        row = self._row[ids.to(self._row.device)]
        if row.numel() and bool((row < 0).any()):
            missing = ids.reshape(-1)[(row.reshape(-1) < 0).nonzero()[0]].item()
            raise IndexError(
                f"NodeRows: node {missing} is not among the {self.ids.numel()} nodes whose features this rank loaded "
                "(its partition and halo). The rank reads features of another partition; load the graph whole "
                "(GraphChunkDataModule(data)) or report the layout that does this."
            )
        return row.long()

    def __getitem__(self, index: Any) -> Tensor:
        """``x[ids]`` by global id; a slice ``x[:k]`` gives the first ``k`` rows held (a probe of shapes/dtypes)."""
        if isinstance(index, slice):
            return self.values[index]
        if isinstance(index, Tensor):
            return self.values[self.rows(index)]
        raise TypeError(f"NodeRows: index by a tensor of global node ids or a slice (got {type(index).__name__}).")

    def index_select(self, dim: int, index: Tensor) -> Tensor:
        if dim != 0:
            raise ValueError(f"NodeRows: rows are selected along dim 0 (got dim={dim}).")
        return self.values.index_select(0, self.rows(index))

    def __len__(self) -> int:
        return self.num_nodes

    def __repr__(self) -> str:
        return f"NodeRows({self.ids.numel()} of {self.num_nodes} nodes, F={self.values.size(-1)}, {self.dtype})"

    def __getstate__(self) -> Tuple[Tensor, Tensor, int]:
        return self.ids, self.values, self.num_nodes

    def __setstate__(self, state: Tuple[Tensor, Tensor, int]) -> None:
        self.__init__(*state)


Features = Union[Tensor, NodeRows]


def select_rows_into(x: Features, ids: Tensor, out: Tensor) -> None:
    """``out[:] = x[ids]`` without a second copy where dtypes agree (``x``: a tensor or :class:`NodeRows`)."""
    if isinstance(x, NodeRows):
        x, ids = x.values, x.rows(ids)
    if out.dtype == x.dtype:
        torch.index_select(x, 0, ids, out=out)
    else:
        out.copy_(x[ids])
