"""README's results table quotes its pages: every figure in a row appears on a page that row links to, and each
results page stays short (prose words, sentence length), so README cannot drift from the records the pages are
checked against (tests/test_*_page.py, tests/test_alternatives_bench.py, tests/test_large_graphs_bench.py)."""

import re
from pathlib import Path

import pytest

from benchmarks.harness.readability import read_page

ROOT = Path(__file__).resolve().parents[1]
FIGURE = re.compile(r"\d[\d,.]*x\b|\d+ of \d+|\d[\d.]*M nodes|\d[\d.]* GiB|\d[\d,]*k nodes")
PAGES = ["docs/results/accuracy.md", "docs/results/alternatives.md", "docs/results/performance.md",
         "docs/results/scale.md", "docs/results/time_to_accuracy.md", "docs/large_graphs.md"]


def results_rows(text: str):
    """(answer, linked pages) of each row of README's results table."""
    section = text.split("## Results", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("question", "---"):
            yield cells[1], re.findall(r"\]\(([^)#]+)", cells[2])


def missing_figures(readme: str, root: Path = ROOT):
    """Figures of README's results rows found on none of the pages their row links to."""
    missing = []
    for answer, links in results_rows(readme):
        pages = " ".join((root / link).read_text() for link in links)
        missing += [(f, links) for f in FIGURE.findall(answer) if f not in pages]
    return missing


def test_every_readme_figure_is_on_a_page_its_row_links_to():
    readme = (ROOT / "README.md").read_text()
    rows = list(results_rows(readme))
    assert len(rows) >= 6 and all(links for _, links in rows)
    assert missing_figures(readme) == []
    first = rows[0][0]
    figure = FIGURE.findall(first)[0]
    edited = readme.replace(first, first.replace(figure, "9" + figure, 1))  # a figure typed by hand is caught
    assert missing_figures(edited)


@pytest.mark.parametrize("page", PAGES)
def test_results_pages_read_at_a_glance(page):
    """Answer first in a table, prose under about 600 words, no sentence over about 40 words, a plot."""
    r = read_page(ROOT / page)
    assert r.answer_first and r.plots >= 1, r
    guide = not page.startswith("docs/results/")  # large_graphs.md is a how-to too: no word limit
    assert (guide or r.prose_words <= 650) and r.longest_sentence <= 45, r
