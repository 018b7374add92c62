"""docs/results/performance.md holds what ``docs/results/performance.json`` gives (no benchmark is run: the page is
rendered again from the records and compared)."""

from benchmarks.harness.page import differences
from benchmarks.performance.page import COMMAND, PAGE, load, render


def test_the_page_is_what_its_records_give():
    records, text = load(), PAGE.read_text()
    expected = render(records, text)
    assert expected == text, f"docs/results/performance.md differs from its records: run {COMMAND}\n" + \
        differences(expected, text, "docs/results/performance.md")
    row = next(line for line in text.splitlines() if line.startswith("| Tolokers, L = 16 |"))
    edited = text.replace(row, row.replace("x |", "1x |", 1), 1)  # the check can fail: a figure changed by hand
    assert edited != text and render(records, edited) != edited


def test_the_answer_table_is_small_and_has_no_unmeasured_rows():
    records = load()
    table = render(records, PAGE.read_text()).split("<!-- BEGIN answer -->\n", 1)[1].split("<!-- END answer -->")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| graph")]
    assert 0 < len(rows) <= 8
    assert all(len(line.strip("|").split("|")) <= 6 for line in rows)
    assert not any("not " in line for line in rows)
