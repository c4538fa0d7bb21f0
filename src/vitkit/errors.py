"""vitkit's expected failures: bad input that the user can fix, as opposed to bugs in vitkit.

Every error here carries what it is about (a file ``path`` or a config ``key``) and a ``hint`` that
says how to fix it; ``str(err)`` is one line made of the three. The command line turns these (and
operating-system errors such as a full disk or a missing folder, see :func:`describe_os_error`) into
one line on stderr and an exit code; anything else is a bug in vitkit and shows its traceback.

The classes also derive from the builtin type callers caught before this module existed
(``ValueError``, ``FileNotFoundError``, ``RuntimeError``, ``ImportError``), so ``except ValueError``
keeps working.

Exit codes of the ``vitkit`` command (CONTRIBUTING.md, "Errors and exit codes"): 0 success; 1 an expected
failure, reported in one line; 2 a usage error; 3 a many-file command where some files failed (each
reported, the rest processed); 70 a bug in vitkit (traceback shown, please report it).
"""
from __future__ import annotations

import errno
import os
from typing import Any, Optional

EXIT_OK = 0
EXIT_ERROR = 1  # an expected failure: bad input, unreadable or unwritable file, bad config
EXIT_USAGE = 2  # the command line itself is wrong (argparse's code too)
EXIT_PARTIAL = 3  # a many-file command: some files failed (each reported), the others were processed
EXIT_BUG = 70  # an unexpected exception: a bug in vitkit (sysexits' EX_SOFTWARE)


class VitkitError(Exception):
    """Base class: a failure the user can fix. ``path`` / ``key`` name the subject, ``hint`` the fix."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str, *, path: Any = None, key: Optional[str] = None, hint: Optional[str] = None):
        self.message, self.path, self.key, self.hint = message, path, key, hint
        super().__init__(self._format())
        self.path = path  # ImportError's own __init__ (MissingDependency) resets ``path``

    def _format(self) -> str:
        subject = str(self.path) if self.path is not None else self.key
        text = self.message
        if subject and not text.startswith(subject):
            text = f"{subject}: {text}"
        if self.hint:
            text = f"{text}: {self.hint}"
        return text

    def __str__(self) -> str:
        return self._format()

    def __reduce__(self):  # picklable (loader worker processes send errors back)
        return (_rebuild, (type(self), self.message, self.path, self.key, self.hint))


def _rebuild(cls, message, path, key, hint):
    return cls(message, path=path, key=key, hint=hint)


class UsageError(VitkitError, ValueError):
    """The command line is wrong: an option value out of range, a missing companion option."""

    exit_code = EXIT_USAGE


class ConfigError(VitkitError, ValueError):
    """An unknown, mistyped or inconsistent model configuration, recipe or override key."""


class CheckpointError(VitkitError, ValueError):
    """A weights file or folder that is corrupt, of an unknown layout, or does not fit its config."""


class UnsafeCheckpointError(CheckpointError):
    """A file that would run code when loaded (a pickle naming functions or classes): refused."""


class DataError(VitkitError, ValueError):
    """A dataset or image that cannot be read or does not have the expected content."""


class NotFoundError(VitkitError, FileNotFoundError):
    """A file, folder or named item that does not exist."""


class OutputError(VitkitError, OSError):
    """A result that could not be written (full disk, file-size limit, no permission); nothing partial
    is left behind (writes go to a temporary file that is renamed only when complete)."""


class InputError(VitkitError, ValueError):
    """An argument of a library function that is out of range or of the wrong shape (a tensor, an array,
    a count): the caller can fix it."""


class ExportError(VitkitError, RuntimeError):
    """An exported model that does not compute what the PyTorch model computes (checked after writing)."""


class BusyError(VitkitError, RuntimeError):
    """A resource another process holds (a run folder's lock): wait for it or choose another."""


class TrainingDiverged(VitkitError, RuntimeError):
    """The loss or the gradients became NaN/Inf: the message names the step and how to go on."""


class MissingDependency(VitkitError, ImportError):
    """An optional package is not installed; ``extra`` names the vitkit extra that installs it (None for a
    package no extra holds: the hint then says what to install)."""

    def __init__(self, message: str, *, extra: Optional[str], path: Any = None, key: Optional[str] = None,
                 hint: Optional[str] = None):
        self.extra = extra
        super().__init__(message, path=path, key=key,
                         hint=hint or (f"pip install 'vitkit[{extra}]'" if extra else None))

    def __reduce__(self):
        return (_rebuild_missing, (self.message, self.extra, self.path, self.key, self.hint))


def _rebuild_missing(message, extra, path, key, hint):
    return MissingDependency(message, extra=extra, path=path, key=key, hint=hint)


def require(extra: str, *modules: str, what: str) -> None:
    """Import ``modules`` or raise :class:`MissingDependency` naming ``extra``: a command calls this
    before any work starts, so a missing optional package fails in a second, not after training."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            raise MissingDependency(f"{what} needs the {name.split('.')[0]} package, which is not installed",
                                    extra=extra) from None


class VitkitWarning(UserWarning):
    """Something suspicious that does not stop the work (e.g. non-finite weights in a checkpoint)."""


# --- operating-system errors ------------------------------------------------------------------
_OS_HINTS = {
    errno.ENOSPC: "no space left on the device: free some space or write elsewhere",
    errno.EDQUOT: "disk quota exceeded: free some space or write elsewhere",
    errno.EFBIG: "file too large for this file system or the process's file-size limit: write elsewhere",
    errno.EACCES: "permission denied: check the permissions, or choose another location",
    errno.EPERM: "operation not permitted: check the permissions, or choose another location",
    errno.EROFS: "the file system is read-only: choose another location",
    errno.ENOENT: "it does not exist: check the path",
    errno.ENOTDIR: "a part of the path is a file, not a folder: choose another path",
    errno.EEXIST: "a part of the path exists as a file where a folder is needed: choose another path",
    errno.EISDIR: "it is a folder where a file is expected: give a file",
    errno.ELOOP: "too many levels of symbolic links (a symlink loop): fix or remove the link",
    errno.ENAMETOOLONG: "the name is too long: choose a shorter path",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n) or use fewer workers",
    errno.EIO: "input/output error: the device or file may be damaged",
}


def os_error_hint(code: Optional[int]) -> str:
    """What an errno means for the user and what to do about it."""
    return _OS_HINTS.get(code or -1, os.strerror(code) if code else "operating-system error")


def describe_os_error(err: OSError) -> str:
    """One line for an operating-system error: the file(s) it is about and what to do."""
    what = _OS_HINTS.get(err.errno or -1, (err.strerror or str(err) or type(err).__name__).rstrip("."))
    names = [n for n in (err.filename, getattr(err, "filename2", None)) if n is not None]
    if names:
        return f"{' -> '.join(os.fsdecode(n) if isinstance(n, bytes) else str(n) for n in names)}: {what}"
    text = str(err)
    return text if err.errno not in _OS_HINTS else f"{text} ({what})"


__all__ = ["EXIT_BUG", "EXIT_ERROR", "EXIT_OK", "EXIT_PARTIAL", "EXIT_USAGE", "BusyError", "CheckpointError",
           "ConfigError", "DataError", "ExportError", "InputError", "MissingDependency", "NotFoundError", "OutputError",
           "TrainingDiverged", "UnsafeCheckpointError", "UsageError", "VitkitError", "VitkitWarning",
           "describe_os_error", "os_error_hint", "require"]
