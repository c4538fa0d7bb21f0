"""Every expected failure raises a ``vitkit.errors`` type, so the command line decides its exit code by type.

The test walks the source (``ast``) and fails on a ``raise ValueError / RuntimeError / TypeError /
FileNotFoundError`` outside the allow-list below, and on an exception class derived from a builtin exception
anywhere but vitkit.errors (a class of another module derives from a vitkit.errors type, or is allow-listed
with its reason); each allow-list entry says why the builtin type is right there. It also holds the error
types to their contract: one line, picklable, the old builtin base.
"""
from __future__ import annotations

import ast
import builtins
import pickle
import sys
from pathlib import Path

import pytest

from vitkit import errors

SRC = Path(__file__).resolve().parent.parent / "src" / "vitkit"
BANNED = {"ValueError", "RuntimeError", "TypeError", "FileNotFoundError"}

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


# (file relative to src/vitkit, class) -> why it derives from a builtin exception outside vitkit.errors
ALLOWED_CLASSES = {
    ("serve/faults.py", "ClientGone"): "control flow inside the service: the client is gone, nobody sees it",
    ("fields.py", "_Mismatch"): "control flow inside coerce_field, which turns it into a ConfigError naming the key",
}
BUILTIN_EXCEPTIONS = {name for name, value in vars(builtins).items()
                      if isinstance(value, type) and issubclass(value, BaseException)}
VITKIT_TYPES = {name for name, value in vars(errors).items()
                if isinstance(value, type) and issubclass(value, errors.VitkitError)}


def _builtin_exception_classes():
    """(file, class) of every class in src/vitkit outside errors.py with a builtin exception among its bases
    and no vitkit.errors type beside it."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = {b.id for b in getattr(node, "bases", ()) if isinstance(b, ast.Name)}
            if isinstance(node, ast.ClassDef) and names & BUILTIN_EXCEPTIONS and not names & VITKIT_TYPES:
                found.append((rel, node.name))
    return found


def test_exception_classes_derive_from_the_hierarchy():
    bad = [f"src/vitkit/{rel}: class {name}" for rel, name in _builtin_exception_classes()
           if (rel, name) not in ALLOWED_CLASSES]
    assert not bad, ("derive from a vitkit.errors type (or define it there), or allow-list it with its reason:\n"
                     + "\n".join(bad))
    assert set(ALLOWED_CLASSES) <= set(_builtin_exception_classes()), "stale ALLOWED_CLASSES entries"
    assert all(reason.strip() for reason in ALLOWED_CLASSES.values())


def test_the_class_walk_sees_a_builtin_subclass(tmp_path, monkeypatch):
    (tmp_path / "m.py").write_text("class Oops(KeyError):\n    pass\nclass Fine(ConfigError):\n    pass\n"
                                   "class AlsoFine(VitkitError, RuntimeError):\n    pass\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    assert _builtin_exception_classes() == [("m.py", "Oops")]


@pytest.mark.parametrize("make", [
    lambda: __import__("vitkit.serve.images", fromlist=["BadImage"]).BadImage(415, "unsupported_media_type", "a PDF"),
    lambda: __import__("vitkit.serve.batching", fromlist=["QueueFull"]).QueueFull(3, "the server is busy"),
    lambda: errors.Fault(401, "unauthorized", "the token is wrong", {"WWW-Authenticate": "Bearer"}, close=True),
])
def test_refusals_are_vitkit_errors_and_survive_pickling(make):
    """The service's refusals (Ray ships them between processes) keep status, code, detail and headers."""
    pytest.importorskip("fastapi")
    err = make()
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(err, errors.Fault) and isinstance(err, errors.VitkitError)
    assert type(back) is type(err) and str(back) == str(err) == err.detail
    assert (back.status, back.error, back.detail, back.headers) == (err.status, err.error, err.detail, err.headers)
    if type(err).__name__ == "QueueFull":
        assert err.status == 503 and err.headers == {"Retry-After": "3"} and back.retry_after == 3


def test_not_found_replaces_the_bare_builtin(tmp_path):
    from vitkit.data.preprocess import find_images, load_image
    for call in (lambda: load_image(tmp_path / "none.png"), lambda: find_images([tmp_path / "none.png"])):
        with pytest.raises(errors.NotFoundError, match="none.png"):
            call()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no images"):  # still the builtin type callers catch
        find_images([tmp_path / "empty"])
    for cls, base in ((errors.ImageError, errors.DataError), (errors.PeerUnavailable, RuntimeError)):
        assert issubclass(cls, base) and issubclass(cls, errors.VitkitError)


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
