"""docs/results/scale.md holds what ``benchmarks/scale/runs.jsonl`` gives (no benchmark is run: the page is rendered
again from the records and compared), and the notes that quote it point at it instead of repeating its figures."""

from benchmarks.scale.page import NOTES, PAGE, load_records, render, render_notes

FIX = "run python -m benchmarks.scale.page"


def test_the_page_is_what_its_records_give():
    records, text = load_records(), PAGE.read_text()
    assert render(records, text=text)[0] == text, f"docs/results/scale.md differs from its records: {FIX}"
    row = next(line for line in text.splitlines() if line.startswith("| 1M | ") and " s (" in line)
    edited = text.replace(row, row.replace(" s (", "0 s (", 1), 1)  # the check can fail: a figure changed by hand
    assert edited != text and render(records, text=edited)[0] != edited


def test_the_targets_note_is_what_the_records_give():
    records, text = load_records(), NOTES.read_text()
    assert render_notes(records, text) == text, f"docs/results/notes/scale.md differs from its records: {FIX}"
    edited = text.replace("0.50x ✓", "0.49x ✓", 1)
    assert edited != text and render_notes(records, edited) != edited


def test_the_answer_holds_only_measured_rows():
    text = PAGE.read_text()
    assert "not run" not in text and "not measured" not in text
    answer = text.split("<!-- BEGIN answer -->", 1)[1].split("<!-- END answer -->", 1)[0]
    rows = [line for line in answer.splitlines() if line.startswith("| ")][2:]
    assert 1 <= len(rows) <= 8 and all(line.count(" | ") <= 5 for line in rows)


def test_memory_notes_quote_no_default_figure_of_their_own():
    """The default's 1M figures live in scale.md's answer; notes/memory.md points there instead of repeating them."""
    memory = (NOTES.parent / "memory.md").read_text()
    assert "../scale.md" in memory
    assert "11.4 (0.51x)" not in memory and "5.24 GiB (1.20x)" not in memory
