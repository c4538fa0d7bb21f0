"""vitkit's expected failures: bad input that the user can fix, as opposed to bugs in vitkit.

Every error here carries what it is about (a file ``path`` or a config ``key``) and a ``hint`` that
says how to fix it; ``str(err)`` is one line made of the three. The command line turns these (and
operating-system errors such as a full disk or a missing folder, see :func:`describe_os_error`) into
one line on stderr and an exit code; anything else is a bug in vitkit and shows its traceback.

The classes also derive from the builtin type callers caught before this module existed
(``ValueError`` / ``FileNotFoundError``), so ``except ValueError`` keeps working.

Exit codes of the ``vitkit`` command (README, "Errors and exit codes"): 0 success; 1 an expected
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


__all__ = ["EXIT_BUG", "EXIT_ERROR", "EXIT_OK", "EXIT_PARTIAL", "EXIT_USAGE", "CheckpointError", "ConfigError",
           "DataError", "NotFoundError", "OutputError", "UnsafeCheckpointError", "UsageError", "VitkitError", "VitkitWarning",
           "describe_os_error", "os_error_hint"]
