"""docs/large_graphs.md and README's row from it hold what ``benchmarks/large_graphs/runs.jsonl`` gives (no benchmark
is run: the page is rendered again from the records and compared)."""

from benchmarks.harness.records import load_cache
from benchmarks.large_graphs.bench import RECORDS
from benchmarks.large_graphs.page import PAGE, ROOT, largest_cluster_nodes, latest, millions, render


def test_the_page_is_what_its_records_give():
    records, text = load_cache(RECORDS), PAGE.read_text()
    assert render(records, text) == text, "docs/large_graphs.md differs from its records: " \
        "run python -m benchmarks.large_graphs.bench --page-only"
    edited = text.replace("| 4.84 GiB |", "| 4.85 GiB |", 1)  # the check can fail: a figure changed by hand
    assert edited != text and render(records, edited) != edited


def test_readmes_row_quotes_the_records():
    records = load_cache(RECORDS)
    n = largest_cluster_nodes(records)
    trained = max(r["nodes"] for r in records if r["kind"] == "single" and r["cap_bytes"] and r["exitcode"] == 0)
    cap = latest(records, kind="cluster", nodes=n, mode="hybrid")["cap_bytes"] / 2**30
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if "large graphs" in line)
    assert f"4 machines capped at {cap:.0f} GiB train {millions(n)} nodes" in row
    assert f"one process under that cap {millions(trained)}" in row
