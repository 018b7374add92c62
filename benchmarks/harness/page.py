"""What every results page generator shares: markdown tables, generated blocks in a hand-written page, one colour per
method across plots, and the check that a page is what its records give.

A page is hand-written prose with generated blocks between markers::

    <!-- BEGIN answer -->
    | ... the table its generator writes from the records ... |
    <!-- END answer -->

:func:`fill_blocks` replaces each block's body and leaves the prose alone; the test suite calls the generator's
``render`` on the page as it is and fails when the result differs (:func:`differences`), so a number edited by hand
in a block, or records changed without regenerating the page, fail the suite.
"""

from __future__ import annotations

import difflib
import re
from typing import Callable, Iterable, List, Mapping, Sequence

COLORS = {
    "exact": "#333333",  # exact full-graph training, one process
    "gnnpipe": "#1f77b4",  # GNNPipeStrategy(), the default pipeline
    "gnnpipe_steps": "#d62728",  # GNNPipe with several optimizer steps an epoch
    "graph_parallel": "#ff7f0e",  # GraphParallelStrategy
    "hybrid": "#9467bd",  # hybrid, stages x partitions
    "cluster_gcn": "#2ca02c",
    "cluster_gcn_coarse": "#98df8a",
    "neighbor_ddp": "#8c564b",
    "other": "#7f7f7f",
}
"""One colour per method on every plot of the docs (matplotlib's tab10, by method)."""


def color(method: str) -> str:
    """The colour of ``method`` (:data:`COLORS`; grey for one not listed)."""
    return COLORS.get(method, COLORS["other"])


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> List[str]:
    """A markdown table's lines: ``header``, then one line a row (cells as ``str``).

    Args:
        header: Column names.
        rows: Cells, as many a row as ``header`` has.
        align: One letter a column, ``l`` or ``r`` (default: every column left-aligned).

    Raises:
        ValueError: A row's length differs from the header's.
    """
    rule = ["---:" if a == "r" else "---" for a in (align or "l" * len(header))]
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"markdown_table: a row of {len(row)} cells under {len(header)} columns: {list(row)}")
        out.append("| " + " | ".join(str(c) for c in row) + " |")
    return out


def fill_blocks(text: str, blocks: Mapping[str, Callable[[], Iterable[str]]], page: str = "page") -> str:
    """``text`` with the body of every block named in ``blocks`` replaced by the lines its builder returns.

    Raises:
        ValueError: A block's markers are missing from ``text`` (named, with the markers to add).
    """
    for name, build in blocks.items():
        body = "\n".join(build())
        pattern = re.compile(rf"(<!-- BEGIN {re.escape(name)} -->\n).*?(<!-- END {re.escape(name)} -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"{page}: no block {name!r}; add <!-- BEGIN {name} --> and <!-- END {name} --> "
                             "on lines of their own where it goes.")
        text = pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)
    return text


def differences(expected: str, actual: str, name: str, limit: int = 40) -> str:
    """A unified diff of ``actual`` (the page) against ``expected`` (what its records give), at most ``limit``
    lines; ``""`` when they are equal."""
    if expected == actual:
        return ""
    diff = list(difflib.unified_diff(expected.splitlines(), actual.splitlines(), f"{name} from its records",
                                     f"{name} as it is", lineterm="", n=1))
    return "\n".join(diff[:limit])


def fmt_ratio(x: float) -> str:
    """``0.55x``: a ratio of two times or sizes as the pages write it."""
    return f"{x:.2f}x"


def style_axes(ax, xlabel: str, ylabel: str, title: str) -> None:
    """Label ``ax`` (units in the labels), give it a light grid and put its legend outside the data (right)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
