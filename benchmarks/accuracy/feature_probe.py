"""Is there a learnable signal in a dataset's features, before and after one GCN averaging step?

    python -m benchmarks.accuracy.feature_probe --dataset Cornell5  # the probe quoted in docs/results/notes/accuracy.md

Trains PyG's 2-layer ``MLP`` (hidden 64, ReLU, dropout 0.5, no normalisation; Adam lr 0.005, weight decay 5e-4,
full batch) on three inputs and prints the validation accuracy every 10 epochs:

- ``x``: the node features alone;
- ``A_hat x``: the features after one step of GCN's symmetric normalised aggregation with self-loops
  (``torch_geometric.nn.conv.gcn_conv.gcn_norm``), the signal a GCN layer starts from;
- ``[x, A_hat x]``: both, as a residual or root-weight model sees them.

First it prints the labels' edge homophily (PyG's ``homophily(method="edge")`` over the edges whose two ends
are labelled) and what random pairing would give (the sum of squared class fractions): an averaging step
keeps the label signal of the neighbours only where the first is well above the second. ``--epochs 0`` prints
only these statistics.

Used to tell a model that cannot learn a dataset in the benchmark's epochs from a dataset without signal.
Deterministic (seed 0, one thread); no GNNPipe code is involved. Cornell5 takes about 2 minutes on one core.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.nn.models import MLP
from torch_geometric.utils import homophily, spmm, to_torch_csr_tensor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.accuracy.run import DATASETS  # noqa: E402  (the loaders and splits of the accuracy benchmark)


def probe(x: torch.Tensor, data, epochs: int, lr: float):
    """Yield ``(epoch, train loss, validation accuracy)`` every 10 epochs of an MLP trained on ``x`` ``[N, F]``."""
    torch.manual_seed(0)
    model = MLP([x.size(1), 64, int(data.y.max()) + 1], dropout=0.5, norm=None)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=5e-4)
    for epoch in range(1, epochs + 1):
        model.train()
        opt.zero_grad()
        loss = F.cross_entropy(model(x)[data.train_mask], data.y[data.train_mask])
        loss.backward()
        opt.step()
        if epoch % 10 == 0:
            model.eval()
            with torch.no_grad():
                pred = model(x).argmax(-1)
            yield epoch, float(loss.detach()), float((pred[data.val_mask] == data.y[data.val_mask]).float().mean())


def label_homophily(data) -> tuple:
    """Return ``(edge homophily, random-pairing baseline, labelled edges)`` over edges with both ends labelled."""
    labelled = data.y >= 0
    edge_index = data.edge_index[:, labelled[data.edge_index[0]] & labelled[data.edge_index[1]]]
    fractions = torch.bincount(data.y[labelled]).float() / int(labelled.sum())
    return float(homophily(edge_index, data.y, method="edge")), float((fractions ** 2).sum()), edge_index.size(1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", choices=list(DATASETS), default="Cornell5")
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--lr", type=float, default=0.005)
    args = p.parse_args()
    torch.set_num_threads(1)
    data = DATASETS[args.dataset]()
    print(f"{args.dataset}: {data.num_nodes} nodes, {data.num_edges} edges, {data.x.size(1)} features, "
          f"mean in-degree {data.num_edges / data.num_nodes:.1f}")
    h, baseline, edges = label_homophily(data)
    print(f"edge homophily of the labels {h:.4f} over {edges} labelled edges; random pairing {baseline:.4f}")
    if args.epochs <= 0:
        return
    edge_index, weight = gcn_norm(data.edge_index, None, data.num_nodes, add_self_loops=True)
    a_hat = to_torch_csr_tensor(edge_index.flip(0), weight, (data.num_nodes, data.num_nodes))  # row = target
    ax = spmm(a_hat, data.x)
    print("| input | epoch | train loss | val accuracy |\n|---|---|---|---|")
    for name, x in (("x", data.x), ("A_hat x", ax), ("[x, A_hat x]", torch.cat([data.x, ax], 1))):
        for epoch, loss, acc in probe(x, data, args.epochs, args.lr):
            print(f"| {name} | {epoch} | {loss:.4f} | {100 * acc:.2f} |")


if __name__ == "__main__":
    main()
