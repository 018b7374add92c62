"""How a results page reads at a glance: its prose words, its longest sentence, whether it opens with a table and
shows a plot.

    python -m benchmarks.harness.readability README.md docs/results/*.md docs/large_graphs.md

Prose is what lies outside tables, code blocks, headings, HTML comments and image lines. A sentence ends at ``.``,
``!`` or ``?`` followed by a space or the end of a paragraph (an abbreviation such as "e.g." splits one early, which
only shortens it). "Answer first" means the first table on the page comes before its second heading.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List

_COMMENT = re.compile(r"<!--.*?-->", re.S)
_CODE = re.compile(r"```.*?```", re.S)
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`*(\"'0-9])")


@dataclass(frozen=True)
class PageReading:
    """What :func:`read_page` found: prose words, the longest sentence's words, whether the first table comes before
    the second heading, and the number of images."""

    path: str
    prose_words: int
    longest_sentence: int
    answer_first: bool
    plots: int


def prose_paragraphs(text: str) -> List[str]:
    """The page's prose, one string a paragraph (tables, code, headings, comments, images left out)."""
    text = _CODE.sub("", _COMMENT.sub("", text))
    paragraphs, current = [], []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith(("#", "|", "![")):
            if current:
                paragraphs.append(" ".join(current))
            current = []
            continue
        current.append(_LINK.sub(r"\1", s.lstrip("-* ")) if s.startswith(("- ", "* ")) else _LINK.sub(r"\1", s))
        if s.startswith(("- ", "* ")):  # a list item is its own paragraph
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return paragraphs


def read_page(path: Path) -> PageReading:
    """Measure one markdown page."""
    text = path.read_text()
    paragraphs = prose_paragraphs(text)
    words = sum(len(p.split()) for p in paragraphs)
    longest = max((len(s.split()) for p in paragraphs for s in _SENTENCE_END.split(p)), default=0)
    lines = _CODE.sub("", _COMMENT.sub("", text)).splitlines()
    headings = [i for i, line in enumerate(lines) if line.startswith("#")]
    tables = [i for i, line in enumerate(lines) if line.startswith("|")]
    second = headings[1] if len(headings) > 1 else len(lines)
    plots = sum(1 for line in lines if line.strip().startswith("!["))
    return PageReading(str(path), words, longest, bool(tables) and tables[0] < second, plots)


def main(argv: List[str]) -> None:
    print("| page | prose words | longest sentence | answer first in a table | plots |")
    print("|---|---|---|---|---|")
    for name in argv:
        r = read_page(Path(name))
        print(f"| {name} | {r.prose_words:,} | {r.longest_sentence} | {'yes' if r.answer_first else 'no'} | {r.plots} |")


if __name__ == "__main__":
    main(sys.argv[1:])
