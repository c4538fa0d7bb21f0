"""The declared backend: which kernels vitkit's layers call, chosen in one place and recorded.

A :class:`Backend` names three choices, each ``auto`` or fixed:

- ``gemm``: the CPU library of the dense layers' products: ``aten`` (torch's own ``addmm`` / ``F.linear``:
  MKL in fp32, oneDNN in bf16) or ``onednn`` (oneDNN's linear primitive);
- ``attention``: ``fused`` (``F.scaled_dot_product_attention``) or ``explicit`` (QK^T, softmax, AV with the
  weights materialised);
- ``int8``: the quantised engine that packs dynamic int8 weights (``x86``, ``fbgemm``, ``onednn``).

``auto`` resolves by a short measurement on this machine (cached per CPU, torch build and thread count in
``~/.cache/vitkit/kernels.json``; ``$XDG_CACHE_HOME`` respected): see :mod:`vitkit.models.kernels` for the
GEMMs and the int8 engine, :mod:`vitkit.models.precision` for attention. Nothing is measured until the first
model call that needs the choice; :func:`measure_all` (``vitkit backend``) measures on demand.

The backend in force is, from the innermost: :func:`use_backend` (a context manager), :func:`set_backend`,
then the ``VITKIT_BACKEND`` environment variable (e.g. ``gemm=aten,attention=explicit``), then all ``auto``.
It is process-wide (the serving executor thread and the caller see the same one). Every choice a process
actually made is kept in :func:`decisions`, which results and benchmark files record next to
:func:`current`'s spec.

Graph consumers (``torch.compile``, ``torch.export``, ONNX export, TorchScript tracing, dispatch modes such as
the FLOP counter) always get ATen's GEMMs whatever is declared, and the fused attention kernel unless the
explicit one is declared (both are plain ATen ops; torch's FLOP counter counts only the explicit one's
products on a CPU) (:func:`graph_capture`).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Dict, Iterator, Optional, Union

import torch

from ..errors import ConfigError

CHOICES = {"gemm": ("auto", "aten", "onednn"),
           "attention": ("auto", "fused", "explicit"),
           "int8": ("auto", "x86", "fbgemm", "onednn")}
ENV = "VITKIT_BACKEND"


@dataclass(frozen=True)
class Backend:
    """The kernel choices of the model's layers; each field ``auto`` (measured on this machine) or fixed."""

    gemm: str = "auto"
    attention: str = "auto"
    int8: str = "auto"

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if value not in CHOICES[f.name]:
                raise ConfigError(f"backend {f.name}={value!r} is not one of {', '.join(CHOICES[f.name])}")

    @classmethod
    def parse(cls, spec: Union[None, str, "Backend"]) -> "Backend":
        """``"gemm=aten,attention=explicit"`` (fields left out stay ``auto``; ``""`` or ``"auto"``: all auto)."""
        if isinstance(spec, Backend):
            return spec
        values: Dict[str, str] = {}
        for part in (spec or "").replace(" ", "").split(","):
            if not part or part == "auto":
                continue
            key, sep, value = part.partition("=")
            if not sep or key not in CHOICES:
                raise ConfigError(f"backend setting {part!r}: write FIELD=VALUE with FIELD one of "
                                  f"{', '.join(CHOICES)} (e.g. gemm=aten,attention=fused)")
            values[key] = value
        return cls(**values)

    @property
    def spec(self) -> str:
        return ",".join(f"{k}={v}" for k, v in asdict(self).items())

    @property
    def fixed(self) -> bool:
        return "auto" not in asdict(self).values()

    def replace(self, **changes: str) -> "Backend":
        """A copy with the given fields (gemm, attention, int8) set."""
        return replace(self, **changes)

    def pinned(self) -> "Backend":
        """Every ``auto`` field fixed to :data:`PLAIN`'s value: the same kernels on every run and machine."""
        return replace(self, **{k: getattr(PLAIN, k) for k, v in asdict(self).items() if v == "auto"})


AUTO = Backend()
PLAIN = Backend(gemm="aten", attention="fused", int8="x86")  # what graph consumers and deterministic runs get

_LOCK = threading.Lock()
_STACK: list = []  # use_backend's nesting, innermost last
_BASE: Optional[Backend] = None  # set_backend's setting


def from_environment() -> Backend:
    """The backend ``VITKIT_BACKEND`` declares (all ``auto`` when it is unset or empty)."""
    try:
        return Backend.parse(os.environ.get(ENV, ""))
    except ConfigError as err:
        raise ConfigError(f"{ENV}={os.environ.get(ENV)!r}: {err}") from None


def current() -> Backend:
    """The backend in force now (see the module docstring for the order)."""
    if _STACK:
        return _STACK[-1]
    return _BASE if _BASE is not None else from_environment()


def set_backend(backend: Union[None, str, Backend]) -> Backend:
    """Declare the process's backend (None: back to ``VITKIT_BACKEND`` / auto); returns the one in force."""
    global _BASE
    _BASE = None if backend is None else Backend.parse(backend)
    return current()


@contextmanager
def use_backend(backend: Union[None, str, Backend] = None, **fields_: str) -> Iterator[Backend]:
    """Run the block with ``backend`` (a spec string or a :class:`Backend`), changed by ``fields_``; the
    previous setting comes back afterwards. ``use_backend(gemm="aten")`` keeps the other fields in force."""
    base = current() if backend is None else Backend.parse(backend)
    chosen = base.replace(**fields_) if fields_ else base
    with _LOCK:
        _STACK.append(chosen)
    try:
        yield chosen
    finally:
        with _LOCK:
            for i in range(len(_STACK) - 1, -1, -1):
                if _STACK[i] is chosen:
                    del _STACK[i]
                    break


def _exporting() -> bool:
    return hasattr(torch.compiler, "is_exporting") and torch.compiler.is_exporting()


def compiling() -> bool:
    """Whether torch.compile is tracing the calls (not torch.export, whose graph other consumers read)."""
    return torch.compiler.is_compiling() and not _exporting()


def graph_capture() -> bool:
    """Whether a graph consumer is watching the calls: torch.compile / torch.export, ONNX export, TorchScript
    tracing, or a Python dispatch mode (FlopCounterMode, fake tensors). They get :data:`PLAIN`."""
    if torch.compiler.is_compiling() or _exporting():
        return True
    if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        return True
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode
    except ImportError:  # pragma: no cover - every supported torch has it
        return False
    return _get_current_dispatch_mode() is not None


# --- what the hardware offers ---------------------------------------------------------------------
def _probe_native_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


_NATIVE_BF16 = _probe_native_bf16()  # a constant, so torch.compile traces the checks without a break


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN's bf16 GEMM kernels run on this CPU (AVX-512-BF16 / AMX / AVX2-VNNI-2)."""
    return _NATIVE_BF16


# --- the measurement cache ------------------------------------------------------------------------
CPU_FIELDS = ("model name", "cpu family", "model", "stepping", "cache size", "flags")


def cpu_fields() -> Dict[str, str]:
    """The first processor's :data:`CPU_FIELDS` in /proc/cpuinfo (empty off Linux)."""
    out: Dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if not key and out:  # a blank line ends the first processor
                    break
                if key in CPU_FIELDS and key not in out:
                    out[key] = value.strip()
    except OSError:
        pass
    return out


def cpu_model_id(fields: Dict[str, str]) -> str:
    """"family 6 model 143 stepping 8, 105 MiB cache": which CPU generation behind a generic model name (hosts
    of one machine kind can differ, and so can their speed)."""
    ident = " ".join(f"{k.replace('cpu ', '')} {fields[k]}" for k in ("cpu family", "model", "stepping") if k in fields)
    cache = fields.get("cache size", "")
    if cache.endswith(" KB") and cache[:-3].isdigit():
        cache = f"{int(cache[:-3]) // 1024} MiB"
    return ", ".join(x for x in (ident, f"{cache} cache" if cache else "") if x)


def _cpu_id() -> str:
    fields = cpu_fields()
    model = fields.get("model name") or platform.processor() or platform.machine()
    ident = cpu_model_id(fields)
    flags = hashlib.sha1(fields.get("flags", "").encode()).hexdigest()[:10]
    return f"{model}{f' ({ident})' if ident else ''} [{flags}]"


# The revision of the measured paths' implementations: raised whenever a kernel path vitkit times changes what
# it runs (2: the explicit attention's softmax in q's dtype), so a cached verdict about the former code is not
# reused for the new one.
PATHS_REVISION = 2


def cache_key(what: str) -> str:
    """The cache entry of one measured choice (``what``, e.g. ``gemm linear float32``) on this CPU, torch
    build, thread count and :data:`PATHS_REVISION`: another machine, torch, thread count or path
    implementation measures again."""
    return (f"{_cpu_id()} | torch {torch.__version__} | threads {torch.get_num_threads()} | paths {PATHS_REVISION} "
            f"| {what}")


_CACHE_FILE: Optional[Path] = None


CACHE_ENV = "VITKIT_KERNEL_CACHE"


def cache_path() -> Path:
    """The measurement cache: :func:`set_cache_file`'s, else ``$VITKIT_KERNEL_CACHE`` (a file; what a test suite
    sets so that the processes it starts measure into its file too), else ``$XDG_CACHE_HOME/vitkit/kernels.json``."""
    if _CACHE_FILE is not None:
        return _CACHE_FILE
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "vitkit" / "kernels.json"


def set_cache_file(path: Union[None, str, Path]) -> None:
    """Keep measurements in ``path`` (None: the default place); e.g. a test suite's own file."""
    global _CACHE_FILE
    _CACHE_FILE = None if path is None else Path(path)


def read_cache() -> dict:
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_cache(key: str, entry: dict) -> None:
    """Add one entry to the cache file atomically; a read-only home keeps the choice for this process only."""
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = read_cache()
        data[key] = entry
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".kernels-")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass


def busy() -> bool:
    """Whether other work shares the CPU (1-minute load average above the core count + 0.5): a measurement
    taken then serves the process that took it but is not cached."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return False
    return load > (os.cpu_count() or 1) + 0.5


MAX_CPU_WAIT = 0.05  # a timing whose threads waited for a CPU > 5% of their time is not cached


def run_delay_s() -> Optional[float]:
    """Seconds this process's threads have spent runnable but waiting for a CPU (Linux schedstat), or None
    where the kernel does not say."""
    total = 0
    try:
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/schedstat") as f:
                    total += int(f.read().split()[1])
            except FileNotFoundError:  # a thread that ended meanwhile
                continue
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e9


class Rounds(dict):
    """:func:`paired_rounds`' seconds per call by name; ``cpu_wait``: the share of the timing's thread-time
    spent waiting for a CPU that other work held (None where unknown)."""
    cpu_wait: Optional[float] = None

    def median(self, name: str) -> float:
        """The median seconds per call of ``name``."""
        return statistics.median(self[name])

    def ratio(self, base: str, other: str) -> float:
        """The median over rounds of ``base``'s time / ``other``'s in the same round (> 1: ``other`` faster)."""
        return statistics.median([a / b for a, b in zip(self[base], self[other])])


def remember(what: str, result: dict, choice: str) -> str:
    """Record a measured choice: in :func:`decisions` and, on a quiet machine, in the cache file. Quiet: the
    1-minute load within the cores (:func:`busy`) and the timing's threads seldom kept from a CPU (its
    ``cpu_wait`` at most :data:`MAX_CPU_WAIT`): a load average lags, and other work that starts or stops during
    a timing can fake a gain (an encoder block timed beside CI showed 1.57x where the quiet machine gave 1.01x)."""
    entry = {**result, "choice": choice, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "load": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}
    waited = result.get("cpu_wait")
    if not busy() and (waited is None or waited <= MAX_CPU_WAIT):
        write_cache(cache_key(what), entry)
    note(what, choice, "measured now")
    return choice


def cached_choice(what: str, allowed) -> Optional[str]:
    """The cached choice for ``what``, if one exists and is still a valid value."""
    entry = read_cache().get(cache_key(what))
    if entry and entry.get("choice") in allowed:
        note(what, entry["choice"], "cached measurement")
        return entry["choice"]
    return None


_DECISIONS: Dict[str, dict] = {}


def note(what: str, choice: str, why: str) -> None:
    """Keep the choice this process made for ``what`` (``why``: fixed, measured now, cached measurement)."""
    _DECISIONS[what] = {"choice": choice, "why": why}


def decisions() -> Dict[str, dict]:
    """Every kernel choice this process has made so far, by what it was made for."""
    return {k: dict(v) for k, v in sorted(_DECISIONS.items())}


_FORGET_HOOKS: list = []


def on_forget(fn) -> None:
    """Register a module's own memo of its choices, cleared by :func:`forget` (kernels, attention)."""
    _FORGET_HOOKS.append(fn)


def forget() -> None:
    """Drop this process's choices (the next call decides again, from the cache or a measurement)."""
    _DECISIONS.clear()
    for fn in _FORGET_HOOKS:
        fn()


def paired_rounds(fns: Dict[str, "object"], rounds: int, autograd: bool = False) -> Rounds:
    """Seconds per call of each function, one call each per round, the order reversed every other round
    (after one untimed call each), under ``inference_mode`` (with autograd on where ``autograd``): the
    measurement behind every ``auto`` choice. Its ``cpu_wait``: how much of the timed rounds' thread-time
    (wall time x torch's thread count) the threads spent waiting for a CPU."""
    names = list(fns)
    times = Rounds({n: [] for n in names})
    with torch.enable_grad() if autograd else torch.inference_mode():
        for n in names:
            fns[n]()
        waited0, start = run_delay_s(), time.perf_counter()
        for r in range(rounds):
            for n in (names if r % 2 == 0 else names[::-1]):
                t0 = time.perf_counter()
                fns[n]()
                times[n].append(time.perf_counter() - t0)
        waited1, wall = run_delay_s(), time.perf_counter() - start
    if waited0 is not None and waited1 is not None and wall > 0:
        times.cpu_wait = round(max(0.0, waited1 - waited0) / (wall * max(1, torch.get_num_threads())), 4)
    return times


def record() -> dict:
    """What a result file records: the declared backend, where it came from, and the choices made."""
    source = "use_backend" if _STACK else "set_backend" if _BASE is not None else \
        ENV if os.environ.get(ENV) else "default"
    return {"declared": current().spec, "source": source, "decisions": decisions()}


def describe(back: Optional[Backend] = None) -> str:
    """A short line: the declared backend and the choices made so far (for machine lines)."""
    back = back or current()
    made = ", ".join(f"{k}={v['choice']}" for k, v in decisions().items())
    return f"backend {back.spec}" + (f" ({made})" if made else "")


__all__ = ["AUTO", "Backend", "CACHE_ENV", "CHOICES", "ENV", "MAX_CPU_WAIT", "PLAIN", "Rounds", "cache_path",
           "cpu_has_native_bf16", "current", "decisions", "describe", "forget", "from_environment", "graph_capture",
           "on_forget", "paired_rounds", "record", "run_delay_s", "set_backend", "set_cache_file", "use_backend"]
