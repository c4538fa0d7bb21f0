"""The version of vitkit, in one place (pyproject.toml reads it from here), and the code a result came from."""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Dict, Optional

__version__ = "0.1.0"


def code_version() -> Dict[str, Any]:
    """The code that is running: vitkit's version and, when it runs from a git checkout, the commit and whether
    tracked code (src/, the benchmark scripts) differs from it (``dirty``); both None outside a checkout or
    without git. Every benchmark JSON records this next to its machine line, so a number names the code that
    produced it."""
    root = Path(__file__).resolve().parents[2]  # src/vitkit/version.py -> the checkout
    commit: Optional[str] = None
    dirty: Optional[bool] = None
    if (root / ".git").exists():  # a folder, or a file in a git worktree
        try:
            def git(*args: str) -> str:
                return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20,
                                      check=True).stdout.strip()

            commit = git("rev-parse", "HEAD")
            # the code: the package and the benchmark scripts, not the results and docs they write
            dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", "src", "benchmarks",
                             ":(exclude)benchmarks/results"))
        except (OSError, subprocess.SubprocessError):
            commit = dirty = None
    return {"vitkit": __version__, "commit": commit, "dirty": dirty}


def describe_code(code: Optional[Dict[str, Any]]) -> Optional[str]:
    """``vitkit 0.1.0 3f2a9c1e0b7d (dirty)``: the code part of a machine line (None when not recorded)."""
    if not code:
        return None
    where = f" {code['commit'][:12]}" if code.get("commit") else ""
    return f"vitkit {code['vitkit']}{where}{' (dirty)' if code.get('dirty') else ''}"
