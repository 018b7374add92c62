"""docs/results/accuracy.md holds what ``benchmarks/accuracy/runs.jsonl`` gives (no benchmark is run: the page is
rendered again from the records and compared), and its answer's counts add up."""

from benchmarks.accuracy.page import MEASURED, PAGE, compare, index, load, pairs, render, seeds_of


def test_the_page_is_what_its_records_give(tmp_path):
    records, text = load(), PAGE.read_text()
    assert render(records, text) == text, "docs/results/accuracy.md differs from its records: " \
        "run python -m benchmarks.accuracy.page"
    row = next(line for line in text.splitlines() if line.startswith("| Tolokers |"))
    edited = tmp_path / PAGE.name
    edited.write_text(text.replace(row, row.replace("-2.85", "-2.58", 1), 1))  # a figure changed by hand
    assert edited.read_text() != text and render(records, edited.read_text(), edited) != edited.read_text()


def test_every_pair_is_counted_once():
    """Within, outside and not informative add up to the pairs listed; every pair has an exact and a default run."""
    ps = pairs(index(load()))
    still = [p for p in ps if not p.informative]
    within = [p for p in ps if p.informative and p.measured.within]
    outside = [p for p in ps if p.informative and not p.measured.within]
    assert len(still) + len(within) + len(outside) == len(ps) > 0
    assert {(p.dataset, p.name) for p in still} == {("Actor", "GraphSAGE-8"), ("Cornell5", "GAT-4")}


def test_todays_default_meets_the_criterion_where_refresh_every_0_does():
    """The answer's sentence on today's default: on the same seeds and epochs, the same verdict on every pair."""
    runs = index(load())
    done = [p for p in pairs(runs) if p.today]
    assert done
    for p in done:
        same = compare(runs, p.dataset, p.model, MEASURED, p.today.epochs, seeds_of(runs, p.today))
        assert same.seeds == p.today.seeds and same.within == p.today.within, p
