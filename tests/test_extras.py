"""The extras and what the code says about them agree (the static half of `make test-extras`, which runs each
extra's commands in an environment with only the core and that extra: tests/extras_smoke.py).

- every extra that the code, README.md or docs/ tell users to install exists in pyproject.toml;
- every package a command checks for before it starts (``require(EXTRA, MODULE, ...)``, the loggers, the
  serve engines, the bench peers, reproduce) is declared by the extra it names;
- every extra the code names has its commands run in its own environment, or a reason why not;
- ``hf`` (the earlier name of ``bench``) declares what ``bench`` does, and ``all`` holds every feature extra.
"""
from __future__ import annotations

import ast
import importlib.metadata
import re
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

import extras_smoke

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "vitkit"
try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = pytest.importorskip("tomli")

EXTRAS: Dict[str, List[str]] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
    "optional-dependencies"]
# extras that are not features, or that `all` leaves out on purpose
NOT_IN_ALL = {"all": "itself", "test": "the test suite's tools", "docs": "make api-docs",
              "hf": "the earlier name of bench (same packages)",
              "ray": "Ray Serve is hundreds of MB: its own install for vitkit serve --ray",
              "datasets": "Hugging Face datasets (and pyarrow): a library feature, installed when wanted"}
# modules whose package is another one (torch's SummaryWriter needs the tensorboard package)
PACKAGE_OF = {"torch.utils.tensorboard": "tensorboard"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(extra: str) -> Set[str]:
    """The distributions an extra declares (names only, canonical)."""
    return {canonical(re.match(r"[A-Za-z0-9._-]+", req).group(0)) for req in EXTRAS[extra]}


def distributions(module: str) -> Set[str]:
    """The distributions that provide ``module`` here (none installed: assumed to share its name)."""
    if module in PACKAGE_OF:
        return {canonical(PACKAGE_OF[module])}
    top = module.split(".")[0]
    return {canonical(d) for d in importlib.metadata.packages_distributions().get(top) or [top]}


def _source_files() -> Iterator[Path]:
    return iter(sorted(SRC.rglob("*.py")))


def required_in_code() -> List[Tuple[str, str, Tuple[str, ...]]]:
    """(where, extra, modules) of every check the code makes for an optional package."""
    out = []
    for path in _source_files():
        tree = ast.parse(path.read_text(), filename=str(path))
        rel = path.relative_to(ROOT)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            consts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if name == "require" and len(consts) >= 2:
                out.append((f"{rel}:{node.lineno}", consts[0], tuple(consts[1:])))
            if name == "MissingDependency":
                for kw in node.keywords:
                    if kw.arg == "extra" and isinstance(kw.value, ast.Constant) and kw.value.value:
                        out.append((f"{rel}:{node.lineno}", kw.value.value, ()))
    from vitkit.bench.peers import EXTRA, PEER_MODULE
    from vitkit.cli.serve import ENGINE_EXTRAS
    from vitkit.reproduce import EXTRA as REPRODUCE
    from vitkit.train.loggers import LOGGER_PACKAGES
    out += [(f"train.log: [{name}]", extra, (module,)) for name, (module, extra) in LOGGER_PACKAGES.items()]
    out += [(f"vitkit serve --engine {name}", extra, tuple(mods)) for name, (extra, *mods) in ENGINE_EXTRAS.items()]
    out += [(f"vitkit bench --peers {peer}", extra, (PEER_MODULE[peer],)) for peer, extra in EXTRA.items()]
    out += [("vitkit reproduce", "reproduce", REPRODUCE)]
    return out


def named_to_users() -> List[Tuple[str, str]]:
    """(where, extra) of every ``vitkit[EXTRA]`` the code and the docs tell users to install."""
    out = []
    docs = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "api" not in p.parts)]
    for path in [*_source_files(), *docs]:
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for m in re.finditer(r"vitkit\[([a-z_,-]+)\]", line):
                out += [(f"{path.relative_to(ROOT)}:{lineno}", e) for e in m.group(1).split(",")]
    return out


def test_every_extra_users_are_told_to_install_exists():
    named = named_to_users() + [(where, extra) for where, extra, _ in required_in_code()]
    assert len(named) > 20
    unknown = [f"{where}: vitkit[{extra}]" for where, extra in named if extra not in EXTRAS]
    assert not unknown, "extras that pyproject.toml does not declare:\n" + "\n".join(unknown)


def test_each_check_names_the_extra_that_declares_its_packages():
    checks = required_in_code()
    assert {"onnx", "openvino", "serve", "plots", "hub", "log", "reproduce", "bench"} <= {e for _, e, _ in checks}
    wrong = [f"{where}: {module} ({', '.join(sorted(distributions(module)))}) is not in the {extra} extra "
             f"({', '.join(sorted(declared(extra)))})"
             for where, extra, modules in checks for module in modules if not distributions(module) & declared(extra)]
    assert not wrong, "\n".join(wrong)


def test_every_extra_the_code_names_runs_in_its_own_environment():
    named = {extra for _, extra, _ in required_in_code()}
    assert not named - set(extras_smoke.CHECKS) - set(extras_smoke.NO_ENVIRONMENT), \
        "add the extra's commands to tests/extras_smoke.py (or say in NO_ENVIRONMENT why not)"
    assert set(extras_smoke.CHECKS) - {"core"} <= set(EXTRAS)
    assert set(extras_smoke.NO_ENVIRONMENT) <= set(EXTRAS)
    # the Makefile builds an environment for each of the extras it lists, and each has commands to run
    make = (ROOT / "Makefile").read_text()
    listed = re.search(r"^EXTRAS \?= (.+)$", make, re.M).group(1).split()
    assert set(listed) <= set(extras_smoke.CHECKS) and {"onnx", "openvino", "serve", "plots", "bench", "hf", "log",
                                                         "hub", "reproduce"} <= set(listed)


def test_the_core_environment_check_knows_every_extra():
    """extras_smoke's MODULES (what the core environment must not have) covers every feature extra."""
    for extra, modules in extras_smoke.MODULES.items():
        assert all(distributions(m) & declared(extra) for m in modules), extra
    assert set(EXTRAS) - set(extras_smoke.MODULES) <= {"all", "test", "docs", "datasets"}


def test_hf_is_bench_and_all_holds_every_feature():
    assert declared("hf") == declared("bench")
    features = set().union(*(declared(e) for e in EXTRAS if e not in NOT_IN_ALL))
    assert not features - declared("all"), f"the all extra lacks {sorted(features - declared('all'))}"


def test_the_missing_extra_check_can_fail():
    ok = "vitkit export: error: ONNX export needs the onnx package, which is not installed: pip install 'vitkit[onnx]'"
    assert extras_smoke.missing_problems(1, ok + "\n", "onnx", "export", 2.0) == []
    assert extras_smoke.missing_problems(1, "log line\n" + ok, "onnx", "export", 2.0, alone=False) == []
    bug = "Traceback (most recent call last):\n  ...\nImportError: no onnx\nvitkit export: internal error: ..."
    assert any("exit code 70" in p for p in extras_smoke.missing_problems(70, bug, "onnx", "export", 2.0))
    assert any("traceback" in p for p in extras_smoke.missing_problems(1, bug + "\n" + ok, "onnx", "export", 2.0))
    assert extras_smoke.missing_problems(1, ok, "openvino", "export", 2.0)  # names another extra
    assert extras_smoke.missing_problems(1, "warning\n" + ok, "onnx", "export", 2.0)  # not alone
    assert extras_smoke.missing_problems(1, ok, "onnx", "export", 3600.0)  # an hour of work first
