"""docs/results/time_to_accuracy.md is what its records give: every generated block rendered again from
benchmarks/time_to_accuracy/runs.jsonl equals the page, and a table figure edited by hand is caught (no benchmark
is run)."""

from benchmarks.harness.page import differences
from benchmarks.time_to_accuracy.page import PAGE, load, render


def test_the_page_is_what_its_records_give():
    records, text = load(), PAGE.read_text()
    expected = render(records, text)
    assert expected == text, ("docs/results/time_to_accuracy.md differs from its records; run python -m "
                              "benchmarks.time_to_accuracy.page\n" + differences(expected, text, PAGE.name))
    row = next(line for line in text.splitlines() if line.startswith("| gcnii16, page's graph | 100 Gbit/s"))
    cells = row.split(" | ")
    edited = text.replace(row, " | ".join(cells[:-1] + ["9" + cells[-1]]), 1)  # GP ÷ GNNPipe epoch, typed by hand
    assert edited != text and render(records, edited) != edited


def test_the_answer_is_one_small_table_before_the_plot():
    text = PAGE.read_text()
    block = text.split("<!-- BEGIN answer -->\n", 1)[1].split("<!-- END answer -->", 1)[0].strip().splitlines()
    assert text.split("\n\n", 2)[1].startswith("**Answer.**")
    assert 3 <= len(block) <= 2 + 8 and all(line.count(" | ") + 1 <= 6 for line in block)
    assert text.index("<!-- END answer -->") < text.index("](time_to_accuracy.png)") < text.index("## Setup")
