"""The package's architecture: subpackages import in one direction, private library APIs only in ``_compat``."""

import ast
import importlib
import inspect
import textwrap
from functools import lru_cache
from pathlib import Path
from typing import Callable, List, Optional, Set

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
            if parts[0] != "lightning_gnnpipe" or len(parts) < 2:
                continue
            if parts[1] not in LAYERS:  # a top-level entry point (cli, models, datasets) sits above every layer
                bad.append(f"{path.relative_to(PACKAGE)} imports {module}")
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


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_self(node: ast.AST) -> bool:
    """``self``, ``cls`` or ``super()``: the object whose class the enclosing class statement defines."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _attribute_uses(tree: ast.AST):
    """Yield ``(line, object node, name, how)`` for every ``x.name`` and ``getattr/setattr/hasattr(x, "name")``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            yield node.lineno, node.value, node.attr, "store" if isinstance(node.ctx, ast.Store) else "read"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            yield node.lineno, node.args[0], node.args[1].value, "store" if node.func.id == "setattr" else "read"


def own_private_names(sources: List[str]) -> Set[str]:
    """Private names our own code defines: in a class body, or as an attribute it stores on an object."""
    own: Set[str] = set()
    for source in sources:
        tree = ast.parse(source)
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    own.add(stmt.name)
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
                own.update(t.id for t in targets if isinstance(t, ast.Name))
        own.update(name for _, _, name, how in _attribute_uses(tree) if how == "store")
    return {name for name in own if _private(name)}


@lru_cache(maxsize=None)
def library_private_names(cls: type) -> frozenset:
    """Private members of a library class: its class attributes and methods, and the ``self._x`` its code stores."""
    names = {n for n in vars(cls) if _private(n)}
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):  # a class defined in C
        return frozenset(names)
    names.update(name for _, obj, name, how in _attribute_uses(tree)
                 if how == "store" and isinstance(obj, ast.Name) and obj.id == "self" and _private(name))
    return frozenset(names)


def _library_bases(cls: Optional[type]) -> List[type]:
    if cls is None:
        return []
    return [b for b in cls.__mro__[1:] if b is not object and not b.__module__.startswith("lightning_gnnpipe")]


def private_api_uses(source: str, own: Set[str], resolve: Callable[[str], Optional[type]]) -> List[str]:
    """Where ``source`` reaches into a library's private members; one ``"<line>: <what>"`` per place.

    * ``x._name`` (or ``getattr(x, "_name")``) with a ``_name`` that no class of ours defines (:func:`own_private_names`);
    * in a class whose bases include library classes (``resolve`` turns a top-level class name into the class):
      ``self._name``, ``cls._name``, ``super()._name``, a method or class attribute ``_name`` where ``_name`` is a
      private member of one of those library classes (:func:`library_private_names`): reading, storing or overriding
      it relies on the library's internals even when our code also assigns it.
    """
    tree = ast.parse(source)
    found = [f"{line}: {ast.unparse(obj)}.{name}" for line, obj, name, _ in _attribute_uses(tree)
             if _private(name) and name not in own]
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        library = set().union(*(library_private_names(b) for b in _library_bases(resolve(cls.name))))
        for stmt in cls.body:
            names = [stmt.name] if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) else [
                t.id for t in (stmt.targets if isinstance(stmt, ast.Assign) else []) if isinstance(t, ast.Name)]
            found += [f"{stmt.lineno}: {cls.name} overrides {name}" for name in names if name in library]
        found += [f"{line}: {cls.name}: {ast.unparse(obj)}.{name}" for line, obj, name, _ in _attribute_uses(cls)
                  if _is_self(obj) and name in library]
    return sorted(set(found), key=lambda f: (int(f.split(":")[0]), f))


PLANTED = """
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher


class Launcher(_MultiProcessingLauncher):
    _cache = None

    def __init__(self, strategy):
        super().__init__(strategy)
        self._mine = strategy

    def launch(self, function, *args, **kwargs):
        return self._strategy.num_processes, self._mine, self._cache

    def _wrapping_function(self, *args):
        return super()._wrapping_function(*args)


def stages(schedule, launcher):
    return schedule._stages + [getattr(schedule, "_stage")], launcher._mine
"""


def test_private_api_check_finds_planted_uses():
    """The check flags each planted use of a private library member, and none of our own private attributes."""
    namespace: dict = {}
    exec(compile(PLANTED, "<planted>", "exec"), namespace)
    found = private_api_uses(PLANTED, own_private_names([PLANTED]), namespace.get)
    assert found == ["13: Launcher: self._strategy", "13: self._strategy", "15: Launcher overrides _wrapping_function",
                     "16: Launcher: super()._wrapping_function", "20: schedule._stage", "20: schedule._stages"]
    clean = PLANTED.replace("self._strategy", "self.strategy").replace("_wrapping_function", "wrapping_function")
    clean = clean.replace("schedule._stages + [getattr(schedule, \"_stage\")]", "list(schedule.stages)")
    namespace = {}
    exec(compile(clean, "<clean>", "exec"), namespace)
    assert private_api_uses(clean, own_private_names([clean]), namespace.get) == []


def test_private_library_members_only_in_compat():
    paths = [p for p in _modules() if p.name != "_compat.py"]
    own = own_private_names([p.read_text() for p in paths])
    bad = []
    for path in paths:
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = importlib.import_module(".".join(rel.parts).removesuffix(".__init__"))
        resolve = lambda name, module=module: getattr(module, name, None)  # noqa: E731
        bad += [f"{path.relative_to(PACKAGE)}:{use}" for use in private_api_uses(path.read_text(), own, resolve)]
    assert not bad, "private members of torch/Lightning/PyG objects outside _compat.py:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_file_sizes(path):
    limit = 300 if path.relative_to(PACKAGE).as_posix() == "strategy/gnnpipe.py" else MAX_LINES
    assert len(path.read_text().splitlines()) <= limit


def test_graph_parallel_takes_only_its_own_options():
    from lightning_gnnpipe import GNNPipeStrategy, GraphParallelStrategy

    assert not issubclass(GraphParallelStrategy, GNNPipeStrategy)
    with pytest.raises(TypeError, match="history_momentum"):
        GraphParallelStrategy(history_momentum=0.5)
