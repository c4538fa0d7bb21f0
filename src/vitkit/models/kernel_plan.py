"""The kernel plan: every kernel choice of a model, decided once, before the first call, and bound to its modules.

A :class:`KernelPlan` is a frozen, printable record: per dtype the library of the inference GEMMs (``aten``:
torch's ``addmm``; ``onednn``: oneDNN's linear primitive, GELU fused), the libraries of a training step's
three products per dense layer, the attention path in inference and in training (``fused`` or
``explicit``), the int8 engine, how many leading tokens the head reads from the last block
(``head_tokens``) and the inference chunk size, each with why it was chosen. Forwards read it from a plain
attribute (``module.plan``) and never decide, time or probe hooks.

Plans come from :func:`resolve` (this module: the declared backend and the measurements already known, no
timing; what a model gets at construction) or :func:`vitkit.models.planner.plan` (the same, timing what is
not known yet: what ``prepare_inference``, the trainer's set-up, each serve engine's build, ``vitkit backend
--measure`` and ``vitkit bench`` call). With nothing declared and nothing measured, the plan is the static
default: ATen GEMMs, ``F.linear`` in training, the fused attention kernel, torch's default int8 engine: the
kernels timm and Hugging Face run.

The declared :class:`Backend` fixes choices (``gemm``, ``attention``, ``int8``: each ``auto`` or a value);
in force, from the innermost: :func:`use_backend` (a context manager, scoped to the thread or task: a
ContextVar), :func:`set_backend` (the process default), the ``VITKIT_BACKEND`` environment variable, all
``auto``. It is read when a plan is resolved, not when a model runs.
"""
from __future__ import annotations

import contextvars
import hashlib
import json
import os
import platform
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Tuple, Union

import torch

from ..errors import ConfigError
from .ops import INT8_ENGINES, cpu_has_native_bf16, int8_candidates, onednn_ok

CHOICES = {"gemm": ("auto", "aten", "onednn"),
           "attention": ("auto", "fused", "explicit"),
           "int8": ("auto",) + INT8_ENGINES}
ENV = "VITKIT_BACKEND"
CACHE_ENV = "VITKIT_KERNEL_CACHE"
# Inference runs the encoder on chunks of whole images (every image is independent, so no number changes),
# sized by memory: each chunk's largest temporary (the MLP's hidden activations, or qkv) stays within
# this many bytes, the largest block glibc's allocator hands out from its reused heap (its mmap threshold
# tops out at 32 MiB on 64-bit Linux). A larger block is a fresh mapping whose pages fault in again on
# every call. It also caps the encoder's scratch memory, so peak memory grows with the batch only by the
# input and the residual stream. Chunks serve a CPU's caches: off the CPU the plan runs the whole batch.
CHUNK_BYTES = 32 << 20
MIXES = ("onednn/onednn/onednn", "onednn/onednn/aten", "onednn/aten/aten")  # training mixes the planner tries
# Raised whenever a timed kernel path changes what it runs, so a kept verdict about the former code is not reused.
PATHS_REVISION = 3


@dataclass(frozen=True)
class Backend:
    """The declared kernel choices; each field ``auto`` (the plan decides) or fixed."""

    gemm: str = "auto"
    attention: str = "auto"
    int8: str = "auto"

    def __post_init__(self):
        for f in fields(self):
            if getattr(self, f.name) not in CHOICES[f.name]:
                raise ConfigError(f"backend {f.name}={getattr(self, f.name)!r} is not one of "
                                  f"{', '.join(CHOICES[f.name])}")

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
PLAIN = Backend(gemm="aten", attention="fused", int8="x86")

_SCOPED: contextvars.ContextVar[Optional[Backend]] = contextvars.ContextVar("vitkit_backend", default=None)
_PROCESS: Dict[str, Backend] = {}  # set_backend's process default, under the key "backend"


def from_environment() -> Backend:
    """The backend ``VITKIT_BACKEND`` declares (all ``auto`` when it is unset or empty)."""
    try:
        return Backend.parse(os.environ.get(ENV, ""))
    except ConfigError as err:
        raise ConfigError(f"{ENV}={os.environ.get(ENV)!r}: {err}") from None


def current() -> Backend:
    """The backend in force in this thread or task (see the module docstring for the order)."""
    scoped = _SCOPED.get()
    return scoped if scoped is not None else _PROCESS.get("backend") or from_environment()


def source() -> str:
    """Where :func:`current` comes from: use_backend, set_backend, the environment variable, or default."""
    if _SCOPED.get() is not None:
        return "use_backend"
    return "set_backend" if "backend" in _PROCESS else ENV if os.environ.get(ENV) else "default"


def set_backend(backend: Union[None, str, Backend]) -> Backend:
    """Declare the process default (None: back to ``VITKIT_BACKEND`` / auto); returns the one in force. It
    applies to plans resolved afterwards (a model built, prepared or trained afterwards)."""
    if backend is None:
        _PROCESS.pop("backend", None)
    else:
        _PROCESS["backend"] = Backend.parse(backend)
    return current()


@contextmanager
def use_backend(backend: Union[None, str, Backend] = None, **changes: str) -> Iterator[Backend]:
    """Resolve plans inside the block with ``backend`` (changed by ``changes``), in this thread or task only."""
    chosen = current() if backend is None else Backend.parse(backend)
    chosen = chosen.replace(**changes) if changes else chosen
    token = _SCOPED.set(chosen)
    try:
        yield chosen
    finally:
        _SCOPED.reset(token)


def chunk_images(batch: int, tokens: int, row_bytes: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Images per inference chunk: as many as keep ``tokens x row_bytes`` per image within ``chunk_bytes`` (0:
    the whole batch), spread evenly over the chunks the batch needs (a small last chunk would run the GEMMs
    at a poor shape)."""
    if chunk_bytes <= 0:
        return batch
    chunks = -(-batch // max(1, chunk_bytes // max(1, tokens * row_bytes)))
    return -(-batch // chunks)


def widest_row(config, dtype: torch.dtype) -> int:
    """Bytes per token of an encoder block's largest temporary (the MLP's hidden row or the qkv row)."""
    return max(config.mlp_dim, 3 * config.width) * dtype.itemsize


# --- the measurement table ----------------------------------------------------------------------------
def cpu_fields() -> Dict[str, str]:
    """The first processor's model name, family, model, stepping, cache size and flags in /proc/cpuinfo."""
    out: Dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if not key and out:  # a blank line ends the first processor
                    break
                if key in ("model name", "cpu family", "model", "stepping", "cache size", "flags") and key not in out:
                    out[key] = value.strip()
    except OSError:
        pass
    return out


def cpu_model_id(fields_: Dict[str, str]) -> str:
    """"family 6 model 143 stepping 8, 105 MiB cache": the CPU generation behind a generic model name."""
    ident = " ".join(f"{k.replace('cpu ', '')} {fields_[k]}" for k in ("cpu family", "model", "stepping")
                     if k in fields_)
    cache = fields_.get("cache size", "")
    if cache.endswith(" KB") and cache[:-3].isdigit():
        cache = f"{int(cache[:-3]) // 1024} MiB"
    return ", ".join(x for x in (ident, f"{cache} cache" if cache else "") if x)


def machine_key() -> str:
    """This CPU, torch build, thread count and :data:`PATHS_REVISION`: what a measurement holds for."""
    f = cpu_fields()
    ident = cpu_model_id(f)
    flags = hashlib.sha1(f.get("flags", "").encode()).hexdigest()[:10]
    cpu = f"{f.get('model name') or platform.processor() or platform.machine()}{f' ({ident})' if ident else ''}"
    return f"{cpu} [{flags}] | torch {torch.__version__} | threads {torch.get_num_threads()} | paths {PATHS_REVISION}"


def default_cache_path() -> Path:
    """``$VITKIT_KERNEL_CACHE`` (a file), else ``$XDG_CACHE_HOME/vitkit/kernels.json``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vitkit" / "kernels.json"


@dataclass
class Measurements:
    """Timed kernel choices by what they choose (``"gemm inference float32 width=768 ..."``), for one machine
    key; backed by a JSON file (``path``) or in memory only (``path=None``: what tests inject)."""

    entries: Dict[str, dict] = field(default_factory=dict)
    path: Optional[Path] = None

    @classmethod
    def load(cls, path: Union[None, str, Path] = None) -> "Measurements":
        """The table kept in ``path`` (default :func:`default_cache_path`) for this machine key."""
        path = Path(path) if path is not None else default_cache_path()
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        mine = data.get(machine_key()) if isinstance(data, dict) else None
        return cls(dict(mine) if isinstance(mine, dict) else {}, path)

    def choice(self, what: str, allowed: Sequence[str]) -> Optional[dict]:
        entry = self.entries.get(what)
        return entry if isinstance(entry, dict) and entry.get("choice") in allowed else None

    def keep(self, what: str, entry: dict) -> dict:
        """Add an entry, and to the file where there is one (atomically; a read-only place keeps it in memory
        only): a later process then reads the same choice, so two processes compute the same numbers. An entry
        timed on a busy machine says ``"quiet": false``; ``vitkit backend --measure`` times it again."""
        entry = self.entries[what] = {**entry, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        if self.path is None:
            return entry
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                data = json.loads(self.path.read_text())
            except (OSError, ValueError):
                data = {}
            data = data if isinstance(data, dict) else {}
            data.setdefault(machine_key(), {})[what] = self.entries[what]
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".kernels-")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError:
            pass
        return entry


# --- the plan -----------------------------------------------------------------------------------------
def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class KernelPlan:
    """Every kernel choice of one model on one device; ``why`` says, per choice, where it came from."""

    device: str = "cpu"
    backend: str = AUTO.spec
    gemm: Mapping[str, str] = field(default_factory=dict)  # dtype -> inference GEMM library
    training: Mapping[str, str] = field(default_factory=dict)  # dtype -> "aten" or forward/grad_input/grad_weight
    attention: Mapping[str, str] = field(default_factory=dict)  # "dtype inference|training" -> fused / explicit
    int8: str = "x86"
    head_tokens: Optional[int] = None  # leading tokens the last block computes (the head reads); None: all
    chunk_bytes: int = CHUNK_BYTES  # inference chunks' largest temporary (0: the whole batch at once)
    why: Mapping[str, str] = field(default_factory=dict)

    def gemm_for(self, dtype: torch.dtype) -> str:
        """The inference GEMM library for ``dtype`` products (``aten`` where the plan has no entry)."""
        return self.gemm.get(dtype_name(dtype), "aten")

    def mix_for(self, dtype: torch.dtype) -> Optional[Tuple[str, str, str]]:
        """The libraries of a training step's (forward, grad_input, grad_weight) products in ``dtype``; None:
        ``F.linear``."""
        mix = self.training.get(dtype_name(dtype), "aten")
        return None if mix == "aten" else tuple(mix.split("/"))  # type: ignore[return-value]

    def attention_for(self, dtype: torch.dtype, grad: bool) -> str:
        """The attention path for ``dtype`` in training (``grad``) or inference (``fused`` where none is set)."""
        return self.attention.get(f"{dtype_name(dtype)} {'training' if grad else 'inference'}", "fused")

    def images_per_chunk(self, batch: int, tokens: int, row_bytes: int, device: torch.device) -> int:
        """Images per inference chunk on ``device`` (:func:`chunk_images` within the plan's ``chunk_bytes``;
        off the CPU the whole batch)."""
        return chunk_images(batch, tokens, row_bytes, self.chunk_bytes if device.type == "cpu" else 0)

    def replace(self, **changes: Any) -> "KernelPlan":
        """A copy with the given fields changed."""
        return replace(self, **changes)

    def as_dict(self) -> Dict[str, Any]:
        """What results and benchmark files record."""
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in asdict(self).items()}

    def describe(self) -> str:
        """One line a person can read: every choice, without the reasons."""
        parts = [f"gemm {k}={v}" for k, v in self.gemm.items()] + \
                [f"training {k}={v}" for k, v in self.training.items()] + \
                [f"attention {k}={v}" for k, v in self.attention.items()] + \
                [f"int8={self.int8}", f"head_tokens={self.head_tokens or 'all'}"]
        return f"{self.device} plan ({self.backend}): " + ", ".join(parts)


def encoder_key(config, dtype: torch.dtype, mode: str, tokens: int, images: int) -> str:
    """The measurement table's name of an encoder choice (GEMMs or attention) for ``config``'s shape."""
    return (f"{mode} {dtype_name(dtype)} width={config.width} heads={config.num_heads} mlp={config.mlp_dim} "
            f"tokens={tokens} images={images} gelu={config.gelu}")


def plan_dtypes(dtype: Union[None, torch.dtype, Sequence[torch.dtype]]) -> Tuple[torch.dtype, ...]:
    if dtype is None:
        return (torch.float32,) + ((torch.bfloat16,) if cpu_has_native_bf16() else ())
    return (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)


def head_tokens_of(config, quantized: bool = False) -> Tuple[Optional[int], str]:
    """How many leading tokens the last block computes, and why."""
    rows = config.head_tokens
    if rows is None:
        return None, "the head reads every token (GAP, MAP, non-global attention) or the config asks for all"
    if quantized:
        return None, "int8 layers quantise activations per call over all rows"
    return rows, f"the head reads the first {rows} token(s) of the last block"


def resolve(config, dtype: Union[None, torch.dtype, Sequence[torch.dtype]] = None, device: Union[str, torch.device]
            = "cpu", backend: Union[None, str, Backend] = None, measurements: Optional[Measurements] = None,
            quantized: bool = False, timer=None, retime_noisy: bool = False) -> KernelPlan:
    """The plan for a model of ``config`` on ``device`` in ``dtype`` (default: fp32, and bf16 where the CPU
    multiplies it natively), from the declared ``backend`` (default: the one in force) and ``measurements``
    (default: the cache file). ``timer(kind, config, dtype, key)`` -> entry is called for a choice under
    ``auto`` that no measurement covers (:func:`vitkit.models.planner.plan` passes one), and with
    ``retime_noisy`` also for one timed on a busy machine; without a timer, the static default stands."""
    back = Backend.parse(backend) if backend is not None else current()
    dev = torch.device(device).type
    table = measurements if measurements is not None else Measurements.load()
    gemm, training, attention, why = {}, {}, {}, {}
    tokens = config.num_patches + config.num_prefix_tokens
    for dt in plan_dtypes(dtype):
        name = dtype_name(dt)
        for kind, out, declared, allowed, default in (
                ("gemm", gemm, back.gemm, ("aten", "onednn"), "aten"),
                ("training", training, back.gemm, ("aten",) + MIXES, "aten")):
            if dev != "cpu" or not onednn_ok(dt):
                out[name], why[f"{kind} {name}"] = "aten", f"only ATen runs {name} products on this {dev}"
            elif declared != "auto":
                out[name] = declared if kind == "gemm" or declared == "aten" else MIXES[0]
                why[f"{kind} {name}"] = "declared"
            else:
                out[name], why[f"{kind} {name}"] = _measured(table, timer, kind, config, dt, tokens, allowed, default,
                                                             retime_noisy)
        for grad in (False, True):
            key = f"{name} {'training' if grad else 'inference'}"
            if dev != "cpu":
                attention[key], why[f"attention {key}"] = "fused", f"the device's fused kernel ({dev})"
            elif back.attention != "auto":
                attention[key], why[f"attention {key}"] = back.attention, "declared"
            else:
                attention[key], why[f"attention {key}"] = _measured(
                    table, timer, "attention training" if grad else "attention", config, dt, tokens,
                    ("fused", "explicit"), "fused", retime_noisy)
    int8, why["int8"] = _int8(back, table, timer if quantized else None, config)
    rows, why["head_tokens"] = head_tokens_of(config, quantized)
    return KernelPlan(device=dev, backend=back.spec, gemm=gemm, training=training, attention=attention, int8=int8,
                      head_tokens=rows, chunk_bytes=CHUNK_BYTES if dev == "cpu" else 0, why=why)


def _measured(table: Measurements, timer, kind: str, config, dtype, tokens, allowed, default,
              retime_noisy: bool = False) -> Tuple[str, str]:
    images = 16 if "training" in kind else chunk_images(16, tokens, widest_row(config, dtype))
    key = encoder_key(config, dtype, kind, tokens, images)
    entry = table.choice(key, allowed)
    if timer is not None and (entry is None or (retime_noisy and not entry.get("quiet", True))):
        entry = table.keep(key, timer(kind, config, dtype, tokens, images))
    if entry is None:
        return default, "static default: nothing measured for this shape"
    return entry["choice"], f"measured {entry.get('date', 'now')}: {entry.get('summary', '')}".rstrip(": ")


def _int8(back: Backend, table: Measurements, timer, config) -> Tuple[str, str]:
    if back.int8 != "auto":
        if back.int8 not in int8_candidates():
            raise ConfigError(f"backend int8={back.int8}: this torch build has the quantised engines "
                              f"{', '.join(int8_candidates())}")
        return back.int8, "declared"
    default = torch.backends.quantized.engine
    key = f"int8 engine default={default}"
    entry = table.choice(key, int8_candidates())
    if entry is None and timer is not None:
        entry = table.keep(key, timer("int8", config, torch.float32, 0, 0))
    if entry is None:
        return default, "torch's default engine: nothing measured"
    return entry["choice"], f"measured {entry.get('date', 'now')}: {entry.get('summary', '')}".rstrip(": ")


STATIC = KernelPlan(why={"all": "static default (modules built outside a model)"})


def bind(module, plan: KernelPlan) -> None:
    """Write ``plan`` into every module under ``module`` that reads one (a ``plan`` attribute)."""
    for m in module.modules():
        if "plan" in m.__dict__:
            m.plan = plan
