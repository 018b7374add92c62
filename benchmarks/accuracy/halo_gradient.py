"""How far the chunked gradient is from the exact full-graph gradient, at the same weights.

    python -m benchmarks.accuracy.halo_gradient --out docs/results/notes  # the "Gradient" block of docs/results/notes/accuracy.md
    python -m benchmarks.accuracy.halo_gradient --datasets Cora --models resgcn8 --seeds 0    # a quick look

A diagnostic for the accuracy table (``benchmarks/accuracy/run.py``), not a timed benchmark. For one set of weights
(the seed's initial weights, or those after `--train-epochs` epochs of exact training; dropout off so that both
sides are deterministic) it computes the training loss's gradient twice:

- exact: the unsplit model on the whole graph;
- chunked: the package's stage module (``GNNStage`` holding all layers, as in ``accuracy.py``) chunk after chunk,
  after an exact history refresh. With the same weights and no dropout, every halo row it reads equals the exact
  embedding, so the forward pass equals the exact one (checked: the largest difference of the outputs is
  printed); only the backward differs. Halo rows are detached (GNNAutoScale), so the gradient that would flow
  from a chunk's loss into another chunk's rows through a cut edge is dropped, at every layer.

With ``halo_gradients="stale"`` (PipeGCN) the dropped gradient is collected and applied one epoch later; the
``stale`` columns give the chunked gradient of a second pass over the chunks at the same weights, i.e. what
stale halo gradients recover in one epoch when the weights do not move (after L epochs at fixed weights they
give the exact gradient: ``tests/test_stage.py``).

Reported per (dataset, model), mean over seeds:

- edges cut: the fraction of edges between the K chunks (%);
- cosine similarity of the chunked to the exact gradient, over all parameters;
- norm ratio ``||g_chunked|| / ||g_exact||`` of the first layer's parameters, and the smallest over layers;
- decay / gradient: the largest over layers of ``||weight_decay * p|| / ||g||`` (Adam's coupled L2 term against
  the loss gradient; weight decay 5e-4 as in ``accuracy.py``), for the exact and the chunked gradient;
- the largest absolute difference between the chunked and the exact forward outputs (0 up to rounding).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Dict, List

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.accuracy.run import (DATASETS, MODELS, TABLE, chunked_forward, chunked_stage,  # noqa: E402
                                      replace_block)
from lightning_gnnpipe import find_layer_stack  # noqa: E402


def _grads(params: List[torch.nn.Parameter]) -> List[torch.Tensor]:
    return [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params]


def _cos(a: List[torch.Tensor], b: List[torch.Tensor]) -> float:
    a, b = torch.cat([t.reshape(-1) for t in a]), torch.cat([t.reshape(-1) for t in b])
    return float(F.cosine_similarity(a, b, dim=0))


def _norm(ts: List[torch.Tensor]) -> float:
    return float(torch.cat([t.reshape(-1) for t in ts]).norm())


def _blocks_stats(blocks, params, g: List[torch.Tensor], g_exact: List[torch.Tensor], weight_decay: float):
    """Per block with parameters: (norm ratio chunked/exact, ||wd p|| / ||g_exact||, ||wd p|| / ||g||)."""
    index = {id(p): i for i, p in enumerate(params)}
    out = []
    for block in blocks:
        ids = [index[id(p)] for p in block.parameters()]
        if not ids:
            continue
        decay = _norm([weight_decay * params[i].detach() for i in ids])
        ge, gc = _norm([g_exact[i] for i in ids]), _norm([g[i] for i in ids])
        out.append((gc / ge, decay / ge, decay / gc))
    return out


def measure(data, model_name: str, seed: int, num_chunks: int, weight_decay: float = 5e-4,
            train_epochs: int = 0) -> Dict[str, float]:
    """Return the cut fraction and the gradient agreement of one model at its initial weights.

    With ``train_epochs``, the weights are first trained that many epochs by exact full-graph training (Adam,
    lr 0.005, dropout on, as in ``accuracy.py``).

    Returns:
        ``cut`` (fraction of edges between chunks), ``forward`` (max abs difference of the chunked and exact
        outputs), for detached halos ``cos`` (all parameters), ``ratio_first`` and ``ratio_min`` (gradient norm
        ratio chunked/exact of the first block and the smallest over blocks), ``decay_exact`` and
        ``decay_chunked`` (largest over blocks of ``||weight_decay * p|| / ||g||``), and ``stale_cos``,
        ``stale_ratio_min`` for a second pass with stale halo gradients.
    """
    torch.manual_seed(seed)
    num_classes = int(data.y.max()) + 1
    model = MODELS[model_name](data.num_features, num_classes)
    train = data.train_mask & (data.y >= 0)
    opt = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=weight_decay)
    for _ in range(train_epochs):
        model.train()
        opt.zero_grad()
        F.cross_entropy(model(data.x, data.edge_index)[train], data.y[train]).backward()
        opt.step()
    model.eval()  # no dropout: both sides deterministic
    params = list(model.parameters())
    blocks = find_layer_stack(model).blocks

    model.zero_grad()
    exact_out = model(data.x, data.edge_index)
    F.cross_entropy(exact_out[train], data.y[train]).backward()
    g_exact = _grads(params)

    out: Dict[str, float] = {}
    for halo_gradients in ("detach", "stale"):
        plan, stage = chunked_stage(data, model, num_chunks, "greedy", halo_gradients=halo_gradients)
        out["cut"] = plan.edge_cut
        stage.forward_full(data.x, write_history=True)
        for _ in range(2 if halo_gradients == "stale" else 1):  # stale: the second pass applies the first's
            stage.next_epoch()
            model.zero_grad()
            chunked = chunked_forward(plan, stage, data.x, num_classes)
            F.cross_entropy(chunked[train], data.y[train]).backward()
        g = _grads(params)
        if halo_gradients == "detach":
            stats = _blocks_stats(blocks, params, g, g_exact, weight_decay)
            out["forward"] = float((chunked - exact_out).detach().abs().max())
            out["cos"] = _cos(g, g_exact)
            out["ratio_first"], out["ratio_min"] = stats[0][0], min(r for r, _, _ in stats)
            out["decay_exact"], out["decay_chunked"] = max(d for _, d, _ in stats), max(d for _, _, d in stats)
        else:
            out["stale_cos"] = _cos(g, g_exact)
            out["stale_ratio_min"] = min(r for r, _, _ in _blocks_stats(blocks, params, g, g_exact, weight_decay))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", choices=list(DATASETS), help="default: those of the accuracy table")
    p.add_argument("--models", nargs="+", choices=list(MODELS), help="default: those of the accuracy table")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--chunks", type=int, default=8, help="K, the number of chunks (default: %(default)s)")
    p.add_argument("--train-epochs", type=int, default=0, help="exact training epochs before measuring")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--out", default=None,
                   help="refresh the gradient block of <out>/accuracy.md (its own block with --train-epochs)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    pairs = [(d, m) for d in (args.datasets or list(TABLE)) for m in (args.models or TABLE.get(d, []))]
    lines = ["| dataset | model | edges cut (%) | cosine, all parameters | norm ratio, first layer | norm ratio, "
             "smallest | decay / gradient, exact | decay / gradient, chunked | stale: cosine, all parameters "
             "| stale: norm ratio, smallest | max forward difference |", "|---" * 11 + "|"]
    data = {}
    for dataset, model_name in pairs:
        if dataset not in data:
            data[dataset] = DATASETS[dataset]()
        rs = [measure(data[dataset], model_name, s, args.chunks, train_epochs=args.train_epochs) for s in args.seeds]
        mean = {k: statistics.mean(r[k] for r in rs) for k in rs[0]}
        mean["forward"] = max(r["forward"] for r in rs)
        line = (f"| {dataset} | {model_name} | {100 * mean['cut']:.1f} | {mean['cos']:.3f} | "
                f"{mean['ratio_first']:.2f} | {mean['ratio_min']:.2f} | {mean['decay_exact']:.2f} | "
                f"{mean['decay_chunked']:.2f} | {mean['stale_cos']:.3f} | {mean['stale_ratio_min']:.2f} | "
                f"{mean['forward']:.1e} |")
        print(line, flush=True)
        lines.append(line)
    if args.out:
        path = os.path.join(args.out, "accuracy.md")
        with open(path) as f:
            text = f.read()
        name = "gradient" if not args.train_epochs else f"gradient-after-{args.train_epochs}-epochs"
        command = ["```bash", "python -m benchmarks.accuracy.halo_gradient " + " ".join(sys.argv[1:]), "```", ""]
        text = replace_block(text, name, command + lines)
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
