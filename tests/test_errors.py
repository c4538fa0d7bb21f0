"""Every expected failure raises a ``vitkit.errors`` type, so the command line decides its exit code by type.

The test walks the source (``ast``) and fails on a ``raise ValueError / RuntimeError / TypeError`` outside
the allow-list below; each allow-list entry says why the builtin type is right there (or whose work
migrates it). It also holds the error types to their contract: one line, picklable, the old builtin base.
"""
from __future__ import annotations

import ast
import pickle
import sys
from pathlib import Path

import pytest

from vitkit import errors

SRC = Path(__file__).resolve().parent.parent / "src" / "vitkit"
BANNED = {"ValueError", "RuntimeError", "TypeError"}

# (file relative to src/vitkit, function) or (file, "*") -> why a builtin type is raised there
ALLOWED = {
    ("smoke.py", "*"): "a failed self-check is a bug in vitkit or torch, not the user's input: the traceback is "
                       "what the report needs",
}


def _bare_raises():
    """(file, function, line, type) of every ``raise Builtin(...)`` of a banned type in src/vitkit."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        tree = ast.parse(path.read_text(), filename=str(path))
        stack = [(tree, "<module>")]
        while stack:
            node, func = stack.pop()
            for child in ast.iter_child_nodes(node):
                name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
                if isinstance(child, ast.Raise) and child.exc is not None:
                    exc = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                    if isinstance(exc, ast.Name) and exc.id in BANNED:
                        found.append((rel, func, child.lineno, exc.id))
                stack.append((child, name))
    return found


def test_expected_failures_raise_vitkit_types():
    bad = [f"src/vitkit/{rel}:{line} raise {kind} in {func}()" for rel, func, line, kind in _bare_raises()
           if (rel, func) not in ALLOWED and (rel, "*") not in ALLOWED]
    assert not bad, ("raise a vitkit.errors type (ConfigError, DataError, InputError, CheckpointError, ...) "
                     "instead, or add an allow-list entry with its reason:\n" + "\n".join(bad))


def test_allow_list_has_no_stale_entries():
    raised = {(rel, func) for rel, func, _, _ in _bare_raises()} | {(rel, "*") for rel, _, _, _ in _bare_raises()}
    stale = sorted(set(ALLOWED) - raised)
    assert not stale, f"allow-list entries that match no bare raise any more: remove them: {stale}"
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_walk_sees_a_bare_raise(tmp_path, monkeypatch):
    """The checker itself can fail: a planted bare raise is found."""
    (tmp_path / "m.py").write_text("def f(x):\n    if x:\n        raise ValueError('no')\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    assert _bare_raises() == [("m.py", "f", 3, "ValueError")]


@pytest.mark.parametrize("cls,base", [(errors.ConfigError, ValueError), (errors.InputError, ValueError),
                                      (errors.DataError, ValueError), (errors.CheckpointError, ValueError),
                                      (errors.TrainingDiverged, RuntimeError), (errors.ExportError, RuntimeError),
                                      (errors.BusyError, RuntimeError), (errors.NotFoundError, FileNotFoundError)])
def test_error_types_keep_their_builtin_base_and_pickle(cls, base):
    err = cls("something is off", key="a.b", hint="fix it")
    assert isinstance(err, base) and isinstance(err, errors.VitkitError)
    assert str(err) == "a.b: something is off: fix it"
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and str(back) == str(err)


def test_missing_dependency_names_the_extra():
    err = errors.MissingDependency("ONNX export needs the onnx package", extra="onnx", path="model.onnx")
    assert isinstance(err, ImportError) and err.extra == "onnx" and err.path == "model.onnx"
    assert str(err) == "model.onnx: ONNX export needs the onnx package: pip install 'vitkit[onnx]'"
    back = pickle.loads(pickle.dumps(err))
    assert back.extra == "onnx" and str(back) == str(err)
    with pytest.raises(errors.MissingDependency, match=r"needs the no_such_pkg_xyz package.*vitkit\[demo\]"):
        errors.require("demo", "json", "no_such_pkg_xyz", what="the demo")
    errors.require("demo", "json", what="the demo")  # present: nothing raised
