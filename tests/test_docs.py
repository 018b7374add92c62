"""The code in the docs runs as written (so the docs cannot rot)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import one_thread  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(doc: str):
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / doc).read_text(), flags=re.S)


def example(doc: str, filename: str) -> str:
    found = [b for b in python_blocks(doc) if b.startswith(f"# file: {filename}\n")]
    assert len(found) == 1, f"docs/{doc} must hold one python block starting with '# file: {filename}'"
    return found[0]


def test_custom_model_check_snippet_passes_on_the_example(cora, one_thread):
    namespace = {"__name__": "custom_gnn"}
    exec(compile(example("custom_models.md", "custom_gnn.py"), "custom_gnn.py", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["DeepResGCN"](cora.num_features, 32, 7, num_layers=4)
    check = [b for b in python_blocks("custom_models.md") if "forward_full" in b]
    assert len(check) == 1
    exec(compile(check[0], "check.py", "exec"), {"model": model, "data": cora})
    with pytest.raises(AssertionError):  # the check can fail: a model whose forward skips a block
        model.forward = lambda x, edge_index: namespace["DeepResGCN"].forward(model, x, edge_index) * 2
        exec(compile(check[0], "check.py", "exec"), {"model": model, "data": cora})


def run_script(tmp_path, name, code):
    """Write ``code`` to ``tmp_path/name`` and run it with the repository importable; assert it exits 0."""
    script = tmp_path / name
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def test_custom_model_example_trains(tmp_path):
    run = run_script(tmp_path, "custom_gnn.py", example("custom_models.md", "custom_gnn.py"))
    assert "balance='time'" in run.stdout + run.stderr
    # its blocks drop out (F.dropout with their number `dropout`): "auto" detaches the halo rows' gradients
    assert "halo_gradients='auto' -> 'detach' (block 0: Encoder(p=0.5))" in run.stdout + run.stderr
    acc = float(re.search(r"test accuracy: ([0-9.]+)", run.stdout).group(1))
    print(f"custom_gnn.py: test accuracy {acc:.4f}")
    assert acc > 0.6, run.stdout


def test_quickstart_runs_as_written(tmp_path):
    code = python_blocks("quickstart.md")[0]
    assert "max_epochs=100" in code
    run = run_script(tmp_path, "quickstart.py",
                     code.replace("max_epochs=100)", "max_epochs=2, logger=False, enable_checkpointing=False)"))
    assert "stage -> layers [[0, 1, 2, 3], [4, 5, 6, 7]]" in run.stdout + run.stderr


def test_readme_quick_start_runs_as_written(tmp_path):
    """The first python block of README.md, the two-change snippet, runs as written (2 epochs instead of 100)."""
    code = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)[0]
    assert "max_epochs=100," in code and "GNNPipeStrategy()" in code
    run = run_script(tmp_path, "readme_quick_start.py",
                     code.replace("max_epochs=100,", "max_epochs=2, logger=False, enable_checkpointing=False,"))
    assert "stage -> layers [[0, 1, 2, 3], [4, 5, 6, 7]]" in run.stdout + run.stderr


MARKDOWN = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _without_code_blocks(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


def _anchors(text: str) -> set:
    """GitHub's heading anchors: lower case, punctuation dropped, each space a hyphen, repeats numbered."""
    anchors, seen = set(), {}
    for line in _without_code_blocks(text).splitlines():
        heading = re.match(r"#{1,6}\s+(.*)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_relative_links_resolve():
    """Every relative link of README.md, CONTRIBUTING.md and docs/ names a file that exists, and its #anchor a heading."""
    broken = []
    for page in MARKDOWN:
        text = re.sub(r"`[^`\n]*`", "", _without_code_blocks(page.read_text()))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_api_reference_matches_the_docstrings():
    """docs/api.md is what ``python docs/make_api.py`` writes from the current docstrings and signatures."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_api", ROOT / "docs" / "make_api.py")
    make_api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_api)
    assert (ROOT / "docs" / "api.md").read_text() == make_api.render(), (
        "docs/api.md is out of date: run `python docs/make_api.py`")
