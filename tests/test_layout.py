"""The code's layout holds: no module imports another module's private names, and no import loops.

ruff's import-private-name rule (PLC2701) skips relative imports, which is how vitkit's modules import
each other, so this walk does the check for src/, benchmarks/ and tests/: ``from M import _name``,
``import M._name`` and ``from M._private import ...`` where M is another vitkit module. A private module
(``cli/_util.py``) may be imported inside its own package.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PACKAGE = SRC / "vitkit"


# "file: imported name" -> why it is allowed
ALLOWED = {
    "benchmarks/time_to_accuracy.py: vitkit.cli._util.parse_overrides":
        "the benchmark takes --set KEY=VALUE exactly as the training commands do",
    "benchmarks/fmnist_record.py: vitkit.cli._util.parse_overrides":
        "the benchmark takes --set / --teacher-set KEY=VALUE exactly as the training commands do",
    "benchmarks/fmnist_record_price.py: vitkit.cli._util.parse_overrides":
        "it takes the record's --set / --teacher-set KEY=VALUE, priced as the record would train them",
    "tests/test_train_logging.py: vitkit.cli._util.parse_overrides": "the test of the CLI's --set parser itself",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(node: ast.ImportFrom, here: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = here.split(".") if is_package else here.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _type_checking_only(tree: ast.AST) -> set:
    """The import nodes inside ``if TYPE_CHECKING:`` blocks (names for annotations; never run)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def _imports(path: Path, here: str) -> Iterator[Tuple[int, str, str]]:
    """(line, module, name or '') of each import in ``path`` that runs (not the ``TYPE_CHECKING`` ones);
    ``here`` is the importing module's name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            module = _absolute(node, here, path.name == "__init__.py")
            for alias in node.names:
                yield node.lineno, module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ""


def _private_parts(module: str) -> List[str]:
    return [p for p in module.split(".") if p.startswith("_") and not p.startswith("__")]


def _files() -> Iterator[Tuple[Path, str]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, _module_name(path)
    for folder in ("benchmarks", "tests"):
        for path in sorted((ROOT / folder).glob("*.py")):
            yield path, f"{folder}.{path.stem}"


def private_imports() -> List[str]:
    found = []
    for path, here in _files():
        for line, module, name in _imports(path, here):
            if not module.startswith("vitkit"):
                continue  # other libraries' privates are their business (and ruff's)
            target = f"{module}.{name}" if name else module
            owner = target.rsplit(".", 1)[0]
            privates = _private_parts(target)
            if not privates:
                continue
            first = target.split(".").index(privates[0])
            package_of_private = ".".join(target.split(".")[:first])  # where the private thing lives
            if here == package_of_private or here.startswith(package_of_private + "."):
                continue  # inside its own package
            if name and owner == here:
                continue
            if f"{path.relative_to(ROOT)}: {target}" not in ALLOWED:
                found.append(f"{path.relative_to(ROOT)}:{line}: {target}")
    return found


def test_no_module_imports_another_modules_private_names():
    found = private_imports()
    assert not found, "make the name public (and say what it is for) or move the code:\n" + "\n".join(found)


def test_the_private_import_check_can_fail(tmp_path, monkeypatch):
    pkg = tmp_path / "vitkit"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("def _hidden(): pass\n")
    (pkg / "b.py").write_text("from .a.x import _hidden\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert private_imports() == ["vitkit/b.py:1: vitkit.a.x._hidden"]


def import_graph() -> Dict[str, Set[str]]:
    """vitkit module -> the vitkit modules it imports, at module level or inside a function (a deferred
    import hides a loop at import time but not from the reader: a loop is a loop)."""
    modules = {name: path for path, name in _files() if name.startswith("vitkit")}
    graph: Dict[str, Set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for _, module, imported in _imports(path, name):
            for target in (f"{module}.{imported}", module):
                if target in modules and target != name:
                    graph[name].add(target)
                    break
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The groups of modules that import each other, directly or round a loop (strongly connected
    components with more than one module; Tarjan's algorithm, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on: Set[str] = set()
    stack: List[str] = []
    out: List[List[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


# loops known when this test was written, each with the reason it is still there
ALLOWED_CYCLES: Dict[Tuple[str, ...], str] = {}


def test_no_import_cycles():
    found = [tuple(c) for c in cycles(import_graph())]
    new = [c for c in found if c not in ALLOWED_CYCLES]
    assert not new, "modules that import each other (move the shared part down a layer):\n" + "\n".join(
        " <-> ".join(c) for c in new)
    stale = [c for c in ALLOWED_CYCLES if c not in found]
    assert not stale, f"these loops are gone: remove them from ALLOWED_CYCLES: {stale}"


def test_the_cycle_check_can_fail():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def _readme_layout() -> Dict[str, str]:
    """CONTRIBUTING.md's Layout block: each ``src/vitkit/...`` entry (a file, or a folder with its continuation
    lines) -> its text."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    block = text.split("## Layout\n\n```\n", 1)[1].split("```", 1)[0]
    entries: Dict[str, str] = {}
    current = None
    for line in block.splitlines():
        if line.startswith("src/vitkit/"):
            current, _, rest = line.partition(" ")
            entries[current] = rest
        elif line.startswith(" ") and current is not None:
            entries[current] += " " + line.strip()
    return entries


def test_readme_layout_names_every_module():
    """A newcomer reads the tree from CONTRIBUTING.md: every module is named under its folder (or on its own
    line at the top), and every entry exists."""
    import re
    entries = _readme_layout()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if path.stem in ("__init__", "__main__") or rel.parts[0] == "recipes":
            continue
        if len(rel.parts) == 1:
            if f"src/vitkit/{rel.name}" not in entries:
                missing.append(str(rel))
            continue
        text = entries.get(f"src/vitkit/{rel.parts[0]}/", "")
        if not re.search(rf"\b{re.escape(path.stem)}\b", text):
            missing.append(str(rel))
    assert not missing, f"CONTRIBUTING.md's Layout does not name: {missing}"
    for entry in entries:
        assert (ROOT / entry).exists(), f"CONTRIBUTING.md's Layout names {entry}, which is not in the tree"


MAX_FILE_LINES, MAX_FUNCTION_LINES = 450, 60
# "file: function" -> why it may be longer: argument tables and claims data read best as one block
LONG_FUNCTIONS = {
    "cli/analysis.py: register": "the analysis commands' argument table",
    "cli/checkpoints.py: register": "the checkpoint commands' argument table",
    "reproduce/catalog.py: claims_table": "the claims' arms and tests, as data",
}


def test_file_and_function_sizes():
    """No source file over 450 lines and no function over 60 outside the declared tables: a module or a
    function a newcomer has to read in one piece stays that size."""
    over = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        text = path.read_text()
        if text.count("\n") > MAX_FILE_LINES:
            over.append(f"{rel}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_FUNCTION_LINES and f"{rel}: {node.name}" not in LONG_FUNCTIONS:
                    over.append(f"{rel}: {node.name} is {size} lines")
    assert not over, over
