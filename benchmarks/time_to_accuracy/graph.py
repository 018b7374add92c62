"""A learnable large graph with community structure, built in ``O(|E|)`` time and memory.

What real graphs have and a uniform stochastic block model lacks, so that both the cut and the labels behave like
those of a citation or product graph:

* **Communities on a ring.** ``|V| / community_size`` communities of consecutive nodes sit on a ring. Of the
  ``|V| * avg_degree / 2`` undirected edges drawn, a fraction ``p_in`` joins two nodes of one community, ``p_near``
  joins a node to one of the ``near`` communities on either side, and ``p_far`` joins two *connector* nodes anywhere
  (a fraction ``connectors`` of the nodes, drawn at random): long-range edges gather on few nodes, as hubs gather them
  in real graphs. METIS then cuts the ring into arcs: the cut is about ``p_far`` (plus the near edges across the
  arcs' ends) and few nodes are another chunk's halo (Cora cut into 8 chunks: cut 0.11, 25% halo nodes). A uniform
  SBM's long-range edges touch every node instead (``benchmarks/scale/run.py``'s graph: 98% halo nodes).
* **Labels that need neighbours.** Each community has a class (uniform over ``num_classes``); a node takes its
  community's class, or with probability ``label_noise`` a uniform random class. Features are the node's own class
  mean (a random unit vector times ``signal``) plus standard normal noise in ``num_features`` dimensions: a node's
  features alone say little (an MLP stays far below a GNN), its community's say much.
* **Split:** ``train`` / ``val`` fractions of the nodes at random, the rest test.

Deterministic for a seed. Peak memory about ``60 |E|`` bytes beside the graph it returns (``16 |E|`` for the edge
list); the edge list is symmetric, sorted and without duplicates or self loops.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch_geometric.data import Data

from lightning_gnnpipe.data.partition import symmetric_csr


@dataclass(frozen=True)
class GraphSpec:
    """The parameters of :func:`community_graph` (their ``asdict`` is the cache key of a graph)."""

    num_nodes: int = 300_000
    avg_degree: int = 20
    community_size: int = 400
    p_in: float = 0.72
    p_near: float = 0.12
    near: int = 2
    connectors: float = 0.12
    num_classes: int = 8
    num_features: int = 64
    signal: float = 1.0
    label_noise: float = 0.2
    train: float = 0.3
    val: float = 0.2
    seed: int = 0

    @property
    def p_far(self) -> float:
        return 1.0 - self.p_in - self.p_near

    def as_dict(self) -> dict:
        return asdict(self)


def on_page_graph(rec: dict) -> bool:
    """Whether a benchmark record ran on the page's own graph (:class:`GraphSpec`'s default ``connectors``; a spec
    without the field has the default), not on the spread graph (``connectors=1.0``)."""
    return rec["spec"]["graph"].get("connectors", GraphSpec().connectors) == GraphSpec().connectors


def _pick(base: torch.Tensor, size: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """A uniform node of ``[base, base + size)`` for every entry."""
    return base + (torch.rand(base.shape, generator=g) * size).long().clamp_max_(size - 1)


def community_graph(spec: GraphSpec = GraphSpec()) -> Data:
    """Build the graph ``spec`` describes (see the module docstring).

    Returns:
        A ``Data`` with ``x`` ``(|V|, F)`` float32, ``edge_index`` ``(2, |E|)`` int64 (symmetric), ``y`` ``(|V|,)``,
        ``train_mask`` / ``val_mask`` / ``test_mask`` ``(|V|,)`` bool, and ``community`` ``(|V|,)``.

    Raises:
        ValueError: Fractions outside ``[0, 1]`` or a community larger than the graph.
    """
    n, s = spec.num_nodes, spec.community_size
    if not (0 <= spec.p_in <= 1 and 0 <= spec.p_near <= 1 and spec.p_far >= -1e-9 and 0 < spec.connectors <= 1):
        raise ValueError(f"community_graph: p_in, p_near, connectors must be fractions with p_in + p_near <= 1 "
                         f"(got p_in={spec.p_in}, p_near={spec.p_near}, connectors={spec.connectors}).")
    if not 1 <= s <= n:
        raise ValueError(f"community_graph: `community_size` must be in [1, num_nodes] (got {s}, num_nodes={n}).")
    g = torch.Generator().manual_seed(spec.seed)
    blocks = -(-n // s)
    start = lambda b: b * s  # noqa: E731  first node of community b
    size = lambda b: torch.clamp(torch.minimum(torch.full_like(b, s), n - b * s), min=1)  # noqa: E731
    m = n * spec.avg_degree // 2
    kind = torch.rand(m, generator=g)
    src = torch.randint(n, (m,), generator=g)
    dst = torch.empty_like(src)
    inside = kind < spec.p_in
    near = (kind >= spec.p_in) & (kind < spec.p_in + spec.p_near)
    far = ~(inside | near)
    del kind
    b = src[inside] // s
    dst[inside] = _pick(start(b), size(b), g)
    offset = torch.randint(1, spec.near + 1, (int(near.sum()),), generator=g)
    offset = torch.where(torch.rand(offset.shape, generator=g) < 0.5, offset, -offset)
    b = (src[near] // s + offset) % blocks
    dst[near] = _pick(start(b), size(b), g)
    hubs = torch.randperm(n, generator=g)[: max(1, int(spec.connectors * n))]
    count = int(far.sum())
    src[far] = hubs[torch.randint(hubs.numel(), (count,), generator=g)]
    dst[far] = hubs[torch.randint(hubs.numel(), (count,), generator=g)]
    del b, offset, inside, near, far
    rowptr, col = symmetric_csr(torch.stack([src, dst]), n)
    del src, dst
    rows = torch.from_numpy(np.repeat(np.arange(n, dtype=np.int64), np.diff(rowptr)))
    edge_index = torch.stack([rows, torch.from_numpy(col)])
    del rows, col, rowptr
    community = torch.arange(n) // s
    klass = torch.randint(spec.num_classes, (blocks,), generator=g)
    y = klass[community]
    noisy = torch.rand(n, generator=g) < spec.label_noise
    y[noisy] = torch.randint(spec.num_classes, (int(noisy.sum()),), generator=g)
    means = torch.randn(spec.num_classes, spec.num_features, generator=g)
    means *= spec.signal / means.norm(dim=1, keepdim=True)
    x = torch.randn(n, spec.num_features, generator=g)
    x += means[y]
    order = torch.randperm(n, generator=g)
    masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
    cut = [0, int(spec.train * n), int((spec.train + spec.val) * n), n]
    for i in range(3):
        masks[i][order[cut[i]:cut[i + 1]]] = True
    return Data(x=x, edge_index=edge_index, y=y, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
                community=community)
