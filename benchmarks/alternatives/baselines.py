"""What a PyG user runs instead of full-graph training: Cluster-GCN and neighbour sampling, as PyG's examples run them.

* **Cluster-GCN** (Chiang et al., KDD 2019; PyG's ``examples/cluster_gcn_reddit.py``: ``ClusterData(num_parts=1500,
  recursive=False)``, ``ClusterLoader(batch_size=20, shuffle=True)``): METIS cuts the graph into 1,500 clusters once;
  every epoch the clusters are shuffled into batches of 20, each batch is the subgraph the 20 clusters induce (the
  edges between its clusters kept, all others dropped), one optimizer step each, the loss over the batch's labelled
  nodes. PyG's ``ClusterData`` needs ``pyg-lib`` or a ``torch-sparse`` built with METIS; neither installs here
  (``pyg-lib`` has no wheel on PyPI, ``torch-sparse`` builds from source without METIS), so :class:`ClusterBatches`
  runs the same algorithm on pymetis's clusters (``lightning_gnnpipe.metis_partition``, METIS k-way, as
  ``recursive=False``), cutting each batch out of the cluster-sorted CSR as ``ClusterLoader`` does.
* **Neighbour sampling under DDP** (Hamilton et al., NeurIPS 2017; PyG's ``examples/multi_gpu/distributed_sampling.py``:
  ``NeighborLoader(num_neighbors=[25, 10], batch_size=1024, shuffle=True, drop_last=True)`` on each rank's share of
  the training nodes, ``DistributedDataParallel``): :func:`neighbor_fanouts` extends the example's two fanouts to the
  model's depth. Needs a sampler backend (``pyg-lib`` or ``torch-sparse``).
"""

from __future__ import annotations

from typing import Iterator, List

import torch
from torch import Tensor
from torch_geometric.data import Data

from lightning_gnnpipe.data.partition import metis_partition

CLUSTER_PARTS, CLUSTER_BATCH = 1500, 20  # PyG's examples/cluster_gcn_reddit.py
NEIGHBOR_FANOUTS, NEIGHBOR_BATCH = (25, 10), 1024  # PyG's examples/multi_gpu/distributed_sampling.py
DEEPER_FANOUT = 5  # each layer beyond the example's two


def neighbor_fanouts(layers: int) -> List[int]:
    """Neighbours sampled per layer, outermost first: the example's ``[25, 10]``, then :data:`DEEPER_FANOUT` for every
    deeper message-passing layer (``layers`` of them)."""
    return list(NEIGHBOR_FANOUTS[:layers]) + [DEEPER_FANOUT] * max(0, layers - len(NEIGHBOR_FANOUTS))


class ClusterBatches:
    """Cluster-GCN's batches of one graph: METIS clusters, shuffled into groups each epoch, each group's induced
    subgraph.

    Args:
        data: The graph (``x``, ``edge_index``, ``y``, ``train_mask``).
        num_parts: Clusters (METIS k-way), default :data:`CLUSTER_PARTS`.
        batch_size: Clusters a batch, default :data:`CLUSTER_BATCH`.
        seed: Seed of the shuffles.

    Attributes:
        metis_s: Seconds METIS took (setup, not training).
    """

    def __init__(self, data: Data, num_parts: int = CLUSTER_PARTS, batch_size: int = CLUSTER_BATCH,
                 seed: int = 0) -> None:
        import time

        n = data.num_nodes
        t0 = time.perf_counter()
        part = metis_partition(data.edge_index, n, num_parts)
        self.metis_s = time.perf_counter() - t0
        self.perm = torch.sort(part, stable=True).indices  # nodes grouped by cluster
        sizes = torch.bincount(part, minlength=num_parts)
        self.start = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])  # cluster c: perm[start[c]:start[c+1]]
        new_id = torch.empty(n, dtype=torch.long)
        new_id[self.perm] = torch.arange(n)
        # CSR of the graph in cluster order: row = target (PyG's adj_t), col = source
        dst, src = new_id[data.edge_index[1]], new_id[data.edge_index[0]]
        order = torch.argsort(dst * n + src)
        self.col = src[order]
        self.rowptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.bincount(dst, minlength=n).cumsum(0)])
        self.data, self.num_parts, self.batch_size = data, num_parts, batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self._local = torch.full((n,), -1, dtype=torch.long)

    def __len__(self) -> int:
        return -(-self.num_parts // self.batch_size)

    def __iter__(self) -> Iterator[Data]:
        """One epoch: ``Data`` batches with ``x``, ``edge_index`` (local ids), ``y``, ``train_mask``, ``n_id``."""
        order = torch.randperm(self.num_parts, generator=self.generator)
        for clusters in order.split(self.batch_size):
            yield self.batch(clusters)

    def batch(self, clusters: Tensor) -> Data:
        """The subgraph that ``clusters`` induce (edges between them kept)."""
        rows = torch.cat([torch.arange(int(self.start[c]), int(self.start[c + 1])) for c in clusters.tolist()])
        self._local[rows] = torch.arange(rows.numel())
        counts = self.rowptr[rows + 1] - self.rowptr[rows]
        first = torch.repeat_interleave(self.rowptr[rows], counts)
        offset = torch.arange(int(counts.sum())) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        src = self._local[self.col[first + offset]]
        dst = torch.repeat_interleave(torch.arange(rows.numel()), counts)
        keep = src >= 0
        self._local[rows] = -1
        nodes = self.perm[rows]
        d = self.data
        return Data(x=d.x[nodes], edge_index=torch.stack([src[keep], dst[keep]]), y=d.y[nodes],
                    train_mask=d.train_mask[nodes], n_id=nodes)

