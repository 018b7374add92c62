"""With dropout on, is the chunked training gradient distributed like the exact one?

    python -m benchmarks.accuracy.dropout_gradient  # the table quoted in docs/results/notes/accuracy.md (about 4 minutes)

A diagnostic for the epochs of CiteSeer ResGCN-4 and GAT-4 in ``docs/results/notes/accuracy.md``, not a timed
benchmark. ``benchmarks/accuracy/halo_gradient.py`` compares the gradients with dropout off, where both sides are
deterministic. Here dropout is on (training mode, as in training): at fixed weights (seed 0's initial weights, or
those after ``--train-epochs`` epochs of exact training, as in ``accuracy.py``) every mode computes the training
loss's gradient ``--draws`` times, each with new dropout masks:

- ``exact``: the unsplit model on the whole graph, the reference sample;
- ``exact (2nd sample)``: as many further exact draws, independent of the first: what sampling alone gives;
- ``K=k``: the chunked model (the package's stage module, as in ``accuracy.py``, default options), one pass over
  the chunks per draw after an exact refresh and one unrecorded pass, so that the history tables hold the
  previous pass's training-mode rows as in training (stale halo rows carry the previous draw's masks).

Columns, each relative to the norm of the reference's mean gradient ``||mean(g_exact)||`` over all parameters:
the distance of the mode's mean gradient to the reference's and the std error of that distance under sampling
alone (``sqrt((s_ref^2 + s_mode^2) / draws)``, ``s^2`` the mean squared deviation of a draw from its sample's
mean); the cosine of the two means; the spread of one draw ``s``; the norm of the mode's mean gradient.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.accuracy.run import DATASETS, MODELS, chunked_forward, chunked_stage  # noqa: E402


def _flat_grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).reshape(-1) for p in model.parameters()])


def sample(data, model_name: str, seed: int, train_epochs: int, draws: int, chunks: List[int]) -> Dict[str, object]:
    """Return ``{mode: (draws, P) gradients}`` and the edge cut per ``K``, at one set of weights."""
    torch.manual_seed(seed)
    num_classes = int(data.y.max()) + 1
    model = MODELS[model_name](data.num_features, num_classes)
    train = data.train_mask & (data.y >= 0)
    opt = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    for _ in range(train_epochs):
        model.train()
        opt.zero_grad()
        F.cross_entropy(model(data.x, data.edge_index)[train], data.y[train]).backward()
        opt.step()
    grads: Dict[str, torch.Tensor] = {}
    cut: Dict[str, float] = {"exact": 0.0, "exact (2nd sample)": 0.0}
    for mode in ("exact", "exact (2nd sample)"):
        model.train()
        rows = []
        for _ in range(draws):
            model.zero_grad()
            F.cross_entropy(model(data.x, data.edge_index)[train], data.y[train]).backward()
            rows.append(_flat_grad(model))
        grads[mode] = torch.stack(rows)
    for k in chunks:
        plan, stage = chunked_stage(data, model, k, "greedy")
        model.eval()
        stage.forward_full(data.x, write_history=True)
        model.train()
        rows = []
        for i in range(draws + 1):
            stage.next_epoch()
            model.zero_grad()
            out = chunked_forward(plan, stage, data.x, num_classes)
            F.cross_entropy(out[train], data.y[train]).backward()
            if i:  # the first pass only fills the tables with training-mode rows
                rows.append(_flat_grad(model))
        grads[f"K={k}"] = torch.stack(rows)
        cut[f"K={k}"] = plan.edge_cut
    return {"grads": grads, "cut": cut}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="CiteSeer", choices=list(DATASETS))
    p.add_argument("--models", nargs="+", default=["resgcn4", "gat4"], choices=list(MODELS))
    p.add_argument("--chunks", nargs="+", type=int, default=[2, 8], help="values of K (default: %(default)s)")
    p.add_argument("--train-epochs", nargs="+", type=int, default=[0, 20],
                   help="exact training epochs before measuring, one table row group each (default: %(default)s)")
    p.add_argument("--draws", type=int, default=40, help="gradients per mode (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    data = DATASETS[args.dataset]()
    print(f"{args.dataset}, seed {args.seed}, {args.draws} draws per mode; columns relative to ||mean(g_exact)||\n")
    print("| model | trained epochs | mode | edges cut (%) | distance of means | std error (sampling) "
          "| cosine of means | spread of one draw | norm of mean |\n" + "|---" * 9 + "|")
    for model_name in args.models:
        for epochs in args.train_epochs:
            r = sample(data, model_name, args.seed, epochs, args.draws, args.chunks)
            ref = r["grads"]["exact"]
            mean_ref = ref.mean(0)
            scale = mean_ref.norm()
            var_ref = ((ref - mean_ref) ** 2).sum(1).mean()
            for mode, g in r["grads"].items():
                if mode == "exact":
                    continue
                mean = g.mean(0)
                var = ((g - mean) ** 2).sum(1).mean()
                se = ((var_ref + var) / args.draws).sqrt() / scale
                print(f"| {model_name} | {epochs} | {mode} | {100 * r['cut'][mode]:.1f} | "
                      f"{float((mean - mean_ref).norm() / scale):.3f} | {float(se):.3f} | "
                      f"{float(F.cosine_similarity(mean, mean_ref, dim=0)):.3f} | {float(var.sqrt() / scale):.2f} | "
                      f"{float(mean.norm() / scale):.2f} |", flush=True)


if __name__ == "__main__":
    main()
