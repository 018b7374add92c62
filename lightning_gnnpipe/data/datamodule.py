"""``GraphChunkDataModule``: one full graph, cut once into pipeline chunks."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader
from torch_geometric.data import Data

from lightning_gnnpipe.data.chunk import ChunkPlan, build_chunk_plan
from lightning_gnnpipe.data.node_rows import NodeRows
from lightning_gnnpipe.data.order import edge_counts, greedy_chunk_order, read_stats, stale_read_stats
from lightning_gnnpipe.data.partition import nested_partition
from lightning_gnnpipe.data.steps import (ChunkGroups, ChunkGroupSampler, check_chunks_per_step, chunk_positions,
                                          step_groups)
from lightning_gnnpipe.data.validation import validate_graph, validate_num_chunks, validate_num_parts, validate_part

if TYPE_CHECKING:
    from lightning_gnnpipe.data.partitioned.layout import PartitionDirectory


def _identity(batch: Any) -> Any:
    return batch


def make_chunk_plan(edge_index: Tensor, num_nodes: int, num_chunks: int, num_parts: int = 1,
                    part: Optional[Tensor] = None, chunk_order: str = "greedy") -> ChunkPlan:
    """The chunk plan of :class:`GraphChunkDataModule` (and of :func:`~lightning_gnnpipe.data.partitioned.
    partition_graph`, so that both train on the same plan): METIS into ``num_chunks`` chunks, nested in
    ``num_parts`` partitions when ``G > 1``, unless ``part`` gives them; ``chunk_order="greedy"`` reorders them.
    Arguments as the DataModule's, already validated."""
    if part is None and num_parts > 1:
        part = nested_partition(edge_index, num_nodes, num_parts, num_chunks // num_parts)
    plan = build_chunk_plan(edge_index, num_nodes, num_chunks, part=part)
    if chunk_order == "greedy":
        plan = plan.reordered(greedy_chunk_order(plan, edge_index, num_parts))
    return plan


class GraphChunkDataModule(LightningDataModule):
    """Serve one full graph per step and hold its METIS chunk plan.

    Every dataloader (train, val, test, predict) yields the same full-graph
    :class:`~torch_geometric.data.Data` once per epoch, so user code sees an ordinary batch and
    the module also trains with a plain single-device ``Trainer``. Under
    :class:`~lightning_gnnpipe.GNNPipeStrategy` the strategy reads :attr:`plan` to cut every step
    into ``num_chunks`` pipeline micro-batches (GNNPipe, arXiv 2308.10087, Sec. 4.1).

    With ``chunks_per_step = c < K`` the training dataloader yields ``K / c`` batches an epoch, one optimizer step
    each (:mod:`~lightning_gnnpipe.data.steps`): the graph again, its ``train_mask`` narrowed to the labelled nodes
    of the step's ``c`` chunks, which ``batch.chunk_ids`` ``(c,)`` names. Under the strategy those chunks run through
    the pipeline and read the other chunks' rows from the history tables (GNNAutoScale's rule); on one device the
    batch is an ordinary full-graph forward with the loss over the step's nodes. Validation, test and predict still
    yield the whole graph once.

    The graph is validated and partitioned here, in the constructor, so that bad input fails in
    the main process before any process group starts; METIS runs once and the plan travels to
    spawned workers with the DataModule.

    The graph goes to a device once (:meth:`device_graph`): Lightning's data hook
    :meth:`transfer_batch_to_device` returns that copy at every step instead of copying every tensor of the
    ``Data`` host to device per step, and the strategies read their features from the same copy. A
    LightningModule's own ``transfer_batch_to_device`` is then not used (Lightning prefers the DataModule's hook and
    warns); ``on_before_batch_transfer`` and ``on_after_batch_transfer`` still run at every step.

    Args:
        data: The graph, on any device (a graph on a GPU is copied to the CPU, where METIS and the plan run; the
            strategy moves what each stage needs to its device; the caller's object is left as it is). Needs
            ``x`` ``(|V|, F)`` and ``edge_index`` ``(2, |E|)``; ``y`` and the
            boolean masks ``train_mask``/``val_mask``/``test_mask`` ``(|V|,)`` are optional.
        num_chunks: Number of chunks ``K`` (pipeline micro-batches per step), ``1 <= K <= |V|``.
        part: Optional chunk id per node ``(|V|,)``, ``torch.long`` in ``[0, K)``, every chunk
            non-empty, to use instead of METIS.
        chunk_order: ``"greedy"`` (default) renumbers the chunks so that as many cross-chunk edges as
            possible are read fresh (:func:`~lightning_gnnpipe.data.order.greedy_chunk_order`);
            ``"metis"`` keeps METIS's part numbers.
        num_parts: Graph partitions ``G`` for hybrid parallelism (``GNNPipeStrategy(graph_parallel_size=G)``):
            METIS cuts the graph into ``G`` partitions, then each into ``K / G`` chunks
            (:func:`~lightning_gnnpipe.data.partition.nested_partition`); chunk ``j * G + g`` is the
            ``j``-th chunk of partition ``g``. ``K`` must be a multiple of ``G``. With ``part`` given,
            chunk ``c`` belongs to partition ``c % G``. Default 1 (pure pipeline parallelism).
        chunks_per_step: ``c``, chunks a training step (an optimizer step): ``None`` (default) is ``K``, one step an
            epoch over the whole graph (GNNPipe's full-graph semantics). A divisor of ``K`` (and a multiple of ``G``)
            below it makes every epoch ``K / c`` steps; needs ``data.train_mask``.
        chunk_groups: Which chunks share a step when ``c < K``: ``"fixed"`` (default; consecutive chunks of the plan's
            order, the same groups every epoch) or ``"shuffle"`` (new random groups every epoch, seeded by ``seed``
            and the epoch; :func:`~lightning_gnnpipe.data.steps.step_groups`).
        seed: The seed of ``chunk_groups="shuffle"`` (the same on every rank).

    Raises:
        TypeError, ValueError: On malformed graphs, ``num_chunks``, ``chunks_per_step`` or ``chunk_groups`` (see
            :func:`~lightning_gnnpipe.data.validation.validate_graph`,
            :func:`~lightning_gnnpipe.data.steps.check_chunks_per_step`).
    """

    def __init__(self, data: Data, num_chunks: int = 8, part: Optional[Tensor] = None,
                 chunk_order: str = "greedy", num_parts: int = 1, chunks_per_step: Optional[int] = None,
                 chunk_groups: str = "fixed", seed: int = 0) -> None:
        super().__init__()
        if any(isinstance(v, Tensor) and v.device.type != "cpu" for _, v in data):
            data = copy.copy(data).cpu()  # shallow: CPU tensors are shared; the caller's Data is not moved
        validate_graph(data)
        self.num_chunks = validate_num_chunks(num_chunks, data.num_nodes)
        self.num_parts = validate_num_parts(num_parts, self.num_chunks)
        if chunk_order not in ("greedy", "metis"):
            raise ValueError(f"GraphChunkDataModule: unknown `chunk_order` {chunk_order!r}. Use 'greedy' or 'metis'.")
        if part is not None:
            validate_part(part, data.num_nodes, num_chunks)
        self.chunks_per_step = check_chunks_per_step(chunks_per_step, self.num_chunks, self.num_parts, chunk_groups,
                                                     isinstance(getattr(data, "train_mask", None), Tensor))
        self.chunk_groups, self.seed = chunk_groups, int(seed)
        self.data: Optional[Data] = data
        self.plan: Optional[ChunkPlan] = make_chunk_plan(data.edge_index, data.num_nodes, num_chunks, num_parts, part,
                                                         chunk_order)
        self.partitions: Optional[PartitionDirectory] = None  # from_partitions: the directory the ranks load from
        self._loaded: Optional[Tuple[int, bool]] = None  # from_partitions: (partition, with features) this rank holds
        self._edges_released = False  # from_partitions: its edge list was let go of after a build
        self._on_device: Dict[torch.device, Tuple[tuple, Data]] = {}
        self._edge_counts: Optional[Tensor] = None

    @classmethod
    def from_partitions(cls, path: str, chunks_per_step: Optional[int] = None, chunk_groups: str = "fixed",
                        seed: int = 0) -> "GraphChunkDataModule":
        """The DataModule of a graph partitioned offline (:func:`~lightning_gnnpipe.data.partitioned.partition_graph`,
        ``lightning-gnnpipe partition``): each rank loads only its part, in :meth:`setup`.

        The constructor reads ``path/META.json`` only (and checks that every file is there with its size), so the
        launching process, a torchrun agent or SLURM's holds no graph. In :meth:`setup` a rank of
        :class:`~lightning_gnnpipe.GNNPipeStrategy` at stage ``s`` of partition ``g`` (``graph_parallel_size = G``)
        or rank ``g`` of :class:`~lightning_gnnpipe.GraphParallelStrategy` loads partition ``g``: the chunk plan,
        the labels and masks, the edges into the partition's nodes and, where its stages read them, the features of
        the partition and its halo (:func:`~lightning_gnnpipe.data.partitioned.load_partition`). With the same
        plan the fit takes the same steps as one from the graph in memory (``tests/test_partitioned.py``).

        Args:
            path: The directory the partitioner wrote.
            chunks_per_step, chunk_groups, seed: As the constructor's.

        Raises:
            FileNotFoundError, ValueError: Not a partition directory, another format version, a missing or
                truncated file (:func:`~lightning_gnnpipe.data.partitioned.read_meta`); a bad ``chunks_per_step``.
        """
        from lightning_gnnpipe.data.partitioned.layout import read_meta

        directory = read_meta(path)
        dm = cls.__new__(cls)
        LightningDataModule.__init__(dm)
        dm.num_chunks, dm.num_parts = directory.num_chunks, directory.num_parts
        dm.chunks_per_step = check_chunks_per_step(chunks_per_step, dm.num_chunks, dm.num_parts, chunk_groups,
                                                   "train_mask" in directory.masks)
        dm.chunk_groups, dm.seed = chunk_groups, int(seed)
        dm.data, dm.plan, dm.partitions, dm._loaded, dm._edges_released = None, None, directory, None, False
        dm._on_device, dm._edge_counts = {}, None
        return dm

    def setup(self, stage: str) -> None:
        """Lightning's hook, in every rank: load this rank's partition when built :meth:`from_partitions` (else
        nothing: the graph is in memory).

        Raises:
            TypeError: The trainer's strategy is not one of lightning_gnnpipe's (only they know which partition a
                rank trains).
            FileNotFoundError, ValueError: A file the rank reads is missing, truncated or changed.
        """
        if self.partitions is None:
            return
        from lightning_gnnpipe.data.partitioned.read import load_edges, load_partition, load_plan

        strategy = getattr(self.trainer, "strategy", None)
        which = getattr(strategy, "partition_to_load", None)
        if which is None:
            raise TypeError(
                "GraphChunkDataModule.from_partitions: each rank loads one partition, which only lightning_gnnpipe's "
                f"strategies assign (got strategy={type(strategy).__name__}). Use GNNPipeStrategy or "
                "GraphParallelStrategy, or GraphChunkDataModule(data) for one device."
            )
        g, features, _ = which()
        if self.data is not None and self._loaded == (g, features):  # a validate/test/predict after a fit
            if self._edges_released:  # the fit let go of the edge list, which a new build reads: read it again
                self.data.edge_index = load_edges(self.partitions, g)
                self._edges_released = False
                self._on_device.clear()
            return
        if self.plan is None:
            self.plan, self._edge_counts = load_plan(self.partitions)
        self.data = load_partition(self.partitions, g, features=features)
        self._loaded, self._edges_released = (g, features), False
        self._on_device.clear()

    def release_edges(self) -> None:
        """Let go of a loaded partition's edge list once the strategy built its chunk graphs from it (called by the
        strategy; ``batch.edge_index`` becomes an empty ``(2, 0)`` tensor: under the strategies the stages aggregate
        over their own chunk graphs, and a partition's edges are not the graph's anyway). The next :meth:`setup`
        (a ``validate``, ``test`` or ``predict`` after the fit, which builds the chunk graphs again) reads it
        again."""
        if self.partitions is not None and self.data is not None:
            self.data.edge_index = self.data.edge_index[:, :0].clone()
            self._edges_released = True
            self._on_device.clear()

    @property
    def num_features(self) -> int:
        """``F``, the width of ``x`` (of a partitioned graph: from ``META.json``, in any process)."""
        if self.partitions is not None:
            return int(self.partitions.meta["num_features"])
        return int(self.data.x.size(1))

    @property
    def num_classes(self) -> Optional[int]:
        """``max(y) + 1`` (of a partitioned graph: from ``META.json``, in any process); ``None`` without ``y``."""
        if self.partitions is not None:
            return self.partitions.meta.get("num_classes")
        y = getattr(self.data, "y", None)
        return int(y.max()) + 1 if isinstance(y, Tensor) and y.numel() else None

    @property
    def steps_per_epoch(self) -> int:
        """Training steps (optimizer steps) an epoch: ``K / chunks_per_step``."""
        return self.num_chunks // self.chunks_per_step

    def step_groups(self, epoch: int) -> List[List[int]]:
        """The chunk groups of training epoch ``epoch``, in the order they run (:func:`~lightning_gnnpipe.data.
        steps.step_groups`): one group of every chunk when ``chunks_per_step`` is ``K``."""
        return step_groups(self.num_chunks, self.chunks_per_step, self.chunk_groups, epoch, self.seed,
                           self.num_parts)

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state["_on_device"] = {}  # device copies stay in the process that made them
        return state

    def device_graph(self, device: Any, host: Sequence[str] = ()) -> Data:
        """Return the graph with its tensors on ``device``, copied once per device and kept.

        The first call for a device moves a shallow copy of :attr:`data` with Lightning's ``move_data_to_device``
        (on the CPU it shares the tensors); later calls return that object, so a step copies nothing. A new copy is
        made if an attribute of :attr:`data` was replaced by another tensor; changes made in place to
        :attr:`data`'s tensors after the first call are not seen on an accelerator.

        Args:
            device: The target device (``"cuda"`` without an index means the current CUDA device).
            host: Attributes that stay the CPU tensors of :attr:`data` (the strategies keep ``edge_index`` there:
                their stages aggregate over their own chunk graphs, so a device copy of the whole edge list,
                ``16 |E|`` bytes, would only sit in every rank's device memory).

        Returns:
            A :class:`~torch_geometric.data.Data` with the same attributes as :attr:`data`.
        """
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        key = tuple((name, id(value)) for name, value in self.data if isinstance(value, Tensor)) + tuple(host)
        kept = self._on_device.get(device)
        if kept is None or kept[0] != key:
            moved = copy.copy(self.data)  # shallow: the caller's Data keeps its tensors
            held = {name: moved[name] for name in host if name in moved}
            for name in held:
                del moved[name]
            moved = move_data_to_device(moved, device)
            if isinstance(moved.x, NodeRows):  # a partition's feature rows (not a tensor to Lightning)
                moved.x = moved.x.to(device)
            for name, value in held.items():
                moved[name] = value
            kept = self._on_device[device] = (key, moved)
        return kept[1]

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Lightning's data hook: the graph's kept device copy (:meth:`device_graph`), other batches as Lightning.

        Under a strategy that names graph attributes to keep on the host (``graph_on_host``, the lightning_gnnpipe
        strategies: ``("edge_index",)``) those stay there."""
        strategy = getattr(self.trainer, "strategy", None) if self.trainer is not None else None
        if batch is self.data:
            return self.device_graph(device, getattr(strategy, "graph_on_host", ()))
        if isinstance(batch, Data) and "chunk_ids" in batch and batch.x is self.data.x:  # a step of some chunks
            moved = copy.copy(self.device_graph(device, getattr(strategy, "graph_on_host", ())))
            moved.train_mask = batch.train_mask.to(device)
            moved.chunk_ids = batch.chunk_ids  # stays on the CPU: read without a device sync
            return moved
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def stale_read_stats(self, reverse: bool = False, alternating: bool = False) -> Tuple[float, float]:
        """``(fraction of edges read historical, mean age in epochs)`` per layer >= 1 in an epoch that runs the chunks
        in order (``reverse``: in reverse order; ``alternating``: the epoch before ran the other order), see
        :func:`~lightning_gnnpipe.data.order.stale_read_stats`."""
        if self._edge_counts is not None:  # from partitions: the whole graph's counts, saved with the plan
            return stale_read_stats(self.plan, None, self.num_parts, reverse, alternating, counts=self._edge_counts)
        return stale_read_stats(self.plan, self.data.edge_index, self.num_parts, reverse, alternating)

    def step_read_stats(self, epoch: int) -> Tuple[float, float]:
        """``(fraction of edges read historical, mean age in epochs)`` per layer >= 1 in training epoch ``epoch`` of
        :meth:`step_groups` (the epoch before: ``epoch - 1``'s groups; epoch 0: its own), see
        :func:`~lightning_gnnpipe.data.order.read_stats`. A row is historical when its chunk runs later in the epoch
        (last epoch's row); one written by an earlier step of the same epoch counts as fresh, as in the paper."""
        if self._edge_counts is None:
            self._edge_counts = edge_counts(self.plan, self.data.edge_index)
        k, g = self.num_chunks, self.num_parts
        now = chunk_positions(self.step_groups(epoch), k, g)
        before = chunk_positions(self.step_groups(max(epoch - 1, 0)), k, g)
        return read_stats(self._edge_counts, now, before, k // g)

    def _loader(self) -> DataLoader:
        return DataLoader([self.data], batch_size=None, collate_fn=_identity)

    def train_dataloader(self) -> DataLoader:
        if self.chunks_per_step == self.num_chunks:
            return self._loader()
        groups = ChunkGroups(self.data, self.plan.nodes, self.steps_per_epoch)
        sampler = ChunkGroupSampler(groups, self.num_chunks, self.chunks_per_step, self.chunk_groups, self.seed,
                                    self.num_parts)
        return DataLoader(groups, sampler=sampler, batch_size=None, collate_fn=_identity)

    def val_dataloader(self) -> DataLoader:
        return self._loader()

    def test_dataloader(self) -> DataLoader:
        return self._loader()

    def predict_dataloader(self) -> DataLoader:
        return self._loader()
