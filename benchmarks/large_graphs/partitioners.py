"""METIS (pymetis, the default) against KaMinPar (``pip install kaminpar``) on one graph, one process each::

    python -m benchmarks.large_graphs.partitioners GRAPH.pt METHOD PARTS OUT.json

``METHOD`` ``pymetis`` or ``kaminpar``. Both partition the symmetrised graph without self loops
(:func:`lightning_gnnpipe.data.partition.symmetric_csr`, timed as ``csr_s``). KaMinPar's Python binding (3.7.3)
reads a graph only from a file: the METIS text file it reads is written first (``file_s``) and read (``load_s``).
Recorded: seconds of each phase, the process's peak RSS (``ru_maxrss``) and its peak over the loaded graph (the
edge list stays in memory throughout), the edge cut and the largest part over the mean (balance).
"""

import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def write_metis(path: str, rowptr, col, n: int) -> None:
    """The METIS graph file (1-based neighbour ids, one line a node)."""
    with open(path, "w") as f:
        f.write(f"{n} {len(col) // 2}\n")
        ids = (col + 1).astype(str)
        for i in range(n):
            f.write(" ".join(ids[rowptr[i]:rowptr[i + 1]]))
            f.write("\n")


def main(graph: str, method: str, parts: int, out: Path) -> None:
    import torch

    from lightning_gnnpipe.data.partition import edge_cut, metis_partition, symmetric_csr

    data = torch.load(graph, weights_only=False, mmap=True)
    edge_index = data.edge_index.clone()  # resident, as in the partitioner
    n = int(data.num_nodes)
    loaded = peak()
    rec = {"method": method, "parts": parts, "num_nodes": n, "num_edges": int(edge_index.size(1))}
    t0 = time.perf_counter()
    if method == "pymetis":
        part = metis_partition(edge_index, n, parts)  # builds the symmetric CSR inside
        rec["partition_s"] = time.perf_counter() - t0
    else:
        import kaminpar

        rowptr, col = symmetric_csr(edge_index, n)
        rec["csr_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        file = str(out.with_suffix(".metis"))
        write_metis(file, rowptr, col, n)
        del rowptr, col
        rec["file_s"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        g = kaminpar.load_graph(file, kaminpar.GraphFileFormat.METIS)
        rec["load_s"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        part = torch.tensor(kaminpar.KaMinPar(2, kaminpar.default_context()).compute_partition(g, parts, 0.03))
        rec["partition_s"] = time.perf_counter() - t1
        Path(file).unlink()
    rec["total_s"] = time.perf_counter() - t0
    rec["peak_bytes"] = peak()
    rec["peak_over_graph_bytes"] = rec["peak_bytes"] - loaded
    rec["edge_cut"] = edge_cut(edge_index, part)
    sizes = torch.bincount(part, minlength=parts).float()
    rec["balance"] = float(sizes.max() / sizes.mean())
    out.write_text(json.dumps(rec))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
