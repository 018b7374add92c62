"""The package's architecture: subpackages import in one direction, private library APIs only in ``_compat``."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_gnnpipe"
LIBRARIES = ("torch", "lightning", "lightning_utilities", "torch_geometric")
# Lower layers first: a subpackage may import only from those before it (and itself).
LAYERS = ["_compat", "data", "nn", "history", "comm", "pipeline", "planner", "strategy"]
MAX_LINES = 400


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []


def _subpackage(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 or rel.stem == "_compat" else rel.stem


def test_subpackages_import_in_one_direction():
    bad = []
    for path in _modules():
        own = _subpackage(path)
        if own not in LAYERS:
            continue  # top-level entry points (__init__, cli, models, datasets) may import anything
        for module, _ in _imports(path):
            parts = module.split(".")
            if parts[0] != "lightning_gnnpipe" or len(parts) < 2 or parts[1] not in LAYERS:
                continue
            if LAYERS.index(parts[1]) > LAYERS.index(own):
                bad.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert not bad, "imports against the layer order " + " < ".join(LAYERS) + ":\n" + "\n".join(bad)


def test_private_library_names_only_in_compat():
    bad = []
    for path in _modules():
        if path.name == "_compat.py":
            continue
        for module, names in _imports(path):
            if module.split(".")[0] not in LIBRARIES:
                continue
            private = [n for n in names if n.startswith("_")] + [p for p in module.split(".") if p.startswith("_")]
            if private:
                bad.append(f"{path.relative_to(PACKAGE)}: from {module} import {private}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_file_sizes(path):
    limit = 300 if path.relative_to(PACKAGE).as_posix() == "strategy/gnnpipe.py" else MAX_LINES
    assert len(path.read_text().splitlines()) <= limit


def test_graph_parallel_takes_only_its_own_options():
    from lightning_gnnpipe import GNNPipeStrategy, GraphParallelStrategy

    assert not issubclass(GraphParallelStrategy, GNNPipeStrategy)
    with pytest.raises(TypeError, match="history_momentum"):
        GraphParallelStrategy(history_momentum=0.5)
