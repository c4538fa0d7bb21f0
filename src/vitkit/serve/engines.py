"""The engines that run a model for ``vitkit serve``, and ``--engine auto``'s choice among them.

- ``torch``: the vitkit model itself (``model.eval()`` under ``torch.inference_mode``, cast to the dtype,
  int8 by :func:`vitkit.models.inference.prepare_inference`); every dtype.
- ``onnxruntime``: vitkit's own ONNX export (:func:`vitkit.export.export_onnx`), fp32.
- ``openvino``: vitkit's own OpenVINO IR (:func:`vitkit.export.export_openvino`), fp32, or bf16 where the
  CPU has native bf16 (``INFERENCE_PRECISION_HINT``).

Every engine maps a batch of model inputs [B, C, H, W] (float32) to ``(logits, features)``: the logits
[B, classes] (for a model without a classifier, the features again) and the pooled pre-logits features
[B, D]. ``auto`` builds each installed engine that supports the dtype, checks its logits against eager
fp32 PyTorch on the same inputs (tolerance per dtype, :data:`TOLERANCE`), times it at the serving batch size
for a bounded time, and keeps the fastest; the others are released.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..errors import ConfigError, ExportError

log = logging.getLogger("vitkit.serve")

ENGINES = ("torch", "onnxruntime", "openvino")
DTYPES = ("fp32", "bf16", "int8")
# The largest |logits - eager fp32 logits| allowed, relative to the largest |eager logit| (at least 1).
TOLERANCE = {"fp32": 1e-3, "bf16": 6e-2, "int8": 1.5e-1}


def kernel_choices(engine: "Engine") -> Dict[str, Any]:
    """The kernel choices in use for ``engine`` (reported by /v1/model and the logs): for the torch engine,
    :func:`vitkit.models.inference.inference_summary` (dtype, the declared backend and what its ``auto``
    resolved to); for the others, the runtime's own kernels, and the declared backend of the vitkit model
    that /v1/explain runs."""
    if engine.name != "torch":
        return {"engine": engine.name, "kernels": f"{engine.name}'s own (vitkit's backend does not apply)",
                "explain": "the vitkit model (attention rollout)"}
    from ..models.inference import inference_summary

    return inference_summary(engine.module)


def installed() -> Dict[str, Optional[str]]:
    """Each engine -> its version, or None where its package is not installed."""
    out: Dict[str, Optional[str]] = {"torch": torch.__version__}
    for name, module in (("onnxruntime", "onnxruntime"), ("openvino", "openvino")):
        try:
            out[name] = __import__(module).__version__
        except Exception:  # noqa: BLE001 - ImportError, or a broken install
            out[name] = None
    return out


class EngineUnavailable(ConfigError):
    """This engine cannot run this model in this dtype here (not installed, or no such dtype)."""


class Engine:
    name = "?"

    def __init__(self, dtype: str):
        self.dtype = dtype
        self.version = ""
        self.notes: List[str] = []

    def run(self, x: torch.Tensor) -> Tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def info(self) -> Dict[str, Any]:
        return {"name": self.name, "version": self.version, "dtype": self.dtype, "notes": list(self.notes)}

    def close(self) -> None:
        pass


class TorchEngine(Engine):
    """The vitkit model itself; ``bf16`` casts its weights (in place), ``int8`` quantises its encoder."""

    name = "torch"

    def __init__(self, model, dtype: str = "fp32"):
        super().__init__(dtype)
        from ..models.inference import Prepared, prepare_inference
        from ..models.vit import VisionTransformer

        self.version = torch.__version__
        if isinstance(model, VisionTransformer) and model.config.attention == "global":
            self.module = prepare_inference(model, "fp32" if dtype == "int8" else dtype,
                                            quantize="int8" if dtype == "int8" else None)
            self.model = self.module.model
        else:
            if dtype == "int8":
                raise EngineUnavailable("int8 quantisation takes a global-attention vitkit ViT")
            self.model = model.eval().requires_grad_(False).to(torch.bfloat16 if dtype == "bf16" else torch.float32)
            self.module = Prepared(self.model) if isinstance(model, VisionTransformer) else self.model
        self._dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        self.device = next(self.model.parameters()).device

    def run(self, x: torch.Tensor) -> Tuple[np.ndarray, np.ndarray]:
        with torch.inference_mode():  # the head's contract: one pass, the same computation as forward
            out = self.model.forward_outputs(x.to(self.device, self._dtype))
        return out.logits.float().cpu().numpy(), out.features.float().cpu().numpy()


@contextlib.contextmanager
def _export_dir(folder: Optional[str]):
    """Where an engine writes the export it loads: ``folder`` when given (the caller's, kept), else a
    temporary folder removed as soon as the engine has loaded it (the runtimes hold the graph in memory; on
    POSIX a mapped weights file stays readable after its name is gone), so no server start leaves files."""
    if folder is not None:
        yield folder
        return
    with tempfile.TemporaryDirectory(prefix="vitkit-serve-") as tmp:
        yield tmp


def _threads() -> int:
    return max(1, torch.get_num_threads())


def _runtime(package: str, extra: str):
    """The runtime ``package`` of an export engine; not installed: :class:`EngineUnavailable` with the extra
    that installs it."""
    try:
        return __import__(package)
    except ImportError:
        raise EngineUnavailable(f"{package} is not installed (pip install 'vitkit[{extra}]')") from None


def _load_export(model, folder: Optional[str], file: str, export: Callable[..., Any], load: Callable[[str], Any]):
    """``load(path)`` of vitkit's export of ``model`` (logits and features outputs, written by ``export`` as
    ``file`` in :func:`_export_dir`)."""
    with _export_dir(folder) as where:
        path = os.path.join(where, file)
        export(model, path, validate=False, features=True)
        return load(path)


class OnnxRuntimeEngine(Engine):
    """vitkit's ONNX export (logits and features outputs) on ONNX Runtime's CPU provider, fp32."""

    name = "onnxruntime"

    def __init__(self, model, dtype: str = "fp32", folder: Optional[str] = None):
        super().__init__(dtype)
        ort = _runtime("onnxruntime", "onnx")
        if dtype != "fp32":
            raise EngineUnavailable(f"onnxruntime runs vitkit's export in fp32 only (asked: {dtype})")
        from ..export import export_onnx

        self.version = ort.__version__
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = _threads()
        opts.inter_op_num_threads = 1
        self.session = _load_export(model, folder, "model.onnx", export_onnx,
                                    lambda path: ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"]))

    def run(self, x: torch.Tensor) -> Tuple[np.ndarray, np.ndarray]:
        logits, feats = self.session.run(["logits", "features"], {"pixels": x.float().cpu().numpy()})
        return logits, feats

    def close(self) -> None:
        self.session = None


def openvino_native_bf16() -> bool:
    try:
        import openvino as ov
        return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    except Exception:  # noqa: BLE001
        return False


class OpenVinoEngine(Engine):
    """vitkit's OpenVINO IR on OpenVINO's CPU plugin: fp32 (hint f32), or bf16 where the CPU has it."""

    name = "openvino"

    def __init__(self, model, dtype: str = "fp32", folder: Optional[str] = None):
        super().__init__(dtype)
        ov = _runtime("openvino", "openvino")
        if dtype == "int8":
            raise EngineUnavailable("openvino runs vitkit's export in fp32 or bf16 (int8 needs NNCF calibration)")
        if dtype == "bf16" and not openvino_native_bf16():
            raise EngineUnavailable("this CPU has no native bf16 for OpenVINO (it would run fp32)")
        from ..export import export_openvino

        self.version = ov.__version__
        config = {"INFERENCE_PRECISION_HINT": "bf16" if dtype == "bf16" else "f32",
                  "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": _threads()}
        self.compiled = _load_export(model, folder, "model.xml", export_openvino,
                                     lambda path: ov.Core().compile_model(path, "CPU", config))
        self.request = self.compiled.create_infer_request()

    def run(self, x: torch.Tensor) -> Tuple[np.ndarray, np.ndarray]:
        out = self.request.infer({"pixels": x.float().cpu().numpy()})
        by_name = {k.get_any_name(): v for k, v in out.items()}
        return np.array(by_name["logits"]), np.array(by_name["features"])

    def close(self) -> None:
        self.request = self.compiled = None


BUILDERS: Dict[str, Callable[..., Engine]] = {"torch": TorchEngine, "onnxruntime": OnnxRuntimeEngine,
                                              "openvino": OpenVinoEngine}


def build_engine(name: str, model, dtype: str = "fp32") -> Engine:
    if name not in BUILDERS:
        raise ConfigError(f"unknown engine {name!r}: use auto, {', '.join(ENGINES)}", key="engine")
    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}: use {', '.join(DTYPES)}", key="dtype")
    return BUILDERS[name](model, dtype)


def compare(ref: np.ndarray, out: np.ndarray, dtype: str) -> Dict[str, Any]:
    """How far ``out`` is from the eager fp32 logits ``ref``: the largest absolute difference, relative to
    the largest |ref| (at least 1), against :data:`TOLERANCE` for ``dtype``."""
    diff = float(np.abs(ref.astype(np.float64) - out.astype(np.float64)).max())
    rel = diff / max(float(np.abs(ref).max()), 1.0)
    return {"max_abs_diff": diff, "rel_diff": rel, "tolerance": TOLERANCE[dtype], "ok": bool(rel <= TOLERANCE[dtype])}


def time_engine(engine: Engine, x: torch.Tensor, budget_s: float = 2.0, min_runs: int = 2,
                max_runs: int = 50) -> Dict[str, Any]:
    """Images/s of ``engine`` on the batch ``x`` by :func:`vitkit.timing.alternate` (one warm-up call sizes
    the run: at least ``min_runs`` timed calls, more while they fit in ``budget_s``); the median call time."""
    from ..timing import alternate

    t0 = time.perf_counter()
    engine.run(x)
    runs = int(min(max_runs, max(min_runs, budget_s // max(time.perf_counter() - t0, 1e-6))))
    med = alternate({engine.name: lambda: engine.run(x)}, warmup=0, repeats=runs)[engine.name].median
    return {"batch": int(x.shape[0]), "runs": runs, "median_s": med, "img_per_s": x.shape[0] / med}


def _release_freed_memory() -> None:
    """Hand the memory of the engines not chosen back to the system (glibc keeps freed blocks otherwise)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def reference_batch(model, batch: int, seed: int = 0) -> torch.Tensor:
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, cfg.in_chans, *cfg.img_size, generator=g)


def _build_candidate(name: str, model, dtype: str, auto: bool, device: torch.device,
                     row: Dict[str, Any]) -> Optional[Engine]:
    """Build engine ``name`` for :func:`choose_engine`; None (with ``row["skipped"]`` saying why) where ``auto``
    leaves it out, an error where a named engine cannot be built."""
    t0 = time.perf_counter()
    try:
        if name != "torch" and device.type != "cpu":
            raise EngineUnavailable(f"{name} runs vitkit's export on the CPU; the model is on {device}")
        eng = build_engine(name, model, dtype)
    except EngineUnavailable as err:
        if not auto:
            raise ConfigError(f"--engine {name}: {err}") from None
        row["skipped"] = str(err)
        log.info("engine %s skipped: %s", name, err)
        return None
    except Exception as err:  # noqa: BLE001 - e.g. an export that fails on this model: auto goes on
        if not auto or name == "torch":
            raise
        row["skipped"] = f"could not be built: {type(err).__name__}: {err}"
        log.warning("engine %s skipped: %s", name, row["skipped"])
        return None
    row["version"] = eng.version
    row["build_s"] = round(time.perf_counter() - t0, 3)
    return eng


def _check_candidate(name: str, eng: Engine, ref: np.ndarray, check: torch.Tensor, dtype: str, auto: bool,
                     row: Dict[str, Any]) -> bool:
    """Whether engine ``name``'s logits on ``check`` are within :data:`TOLERANCE` of the eager fp32 ``ref``; where
    not, it is closed, and a named engine refused (``auto`` skips it)."""
    row.update(compare(ref, eng.run(check)[0], dtype))
    if row["ok"]:
        return True
    msg = (f"{name} ({dtype}) logits differ from eager fp32 by {row['rel_diff']:.3g} of the largest logit "
           f"(> {row['tolerance']:g})")
    eng.close()
    if not auto:
        raise ExportError(msg + ": not serving it")
    row["skipped"] = msg
    log.warning("engine %s skipped: %s", name, msg)
    return False


def choose_engine(model, engine: str = "auto", dtype: str = "fp32", batch: int = 16, budget_s: float = 2.0,
                  candidates: Sequence[str] = ENGINES) -> Tuple[Engine, Dict[str, Any]]:
    """(engine, report). ``engine="auto"``: every installed engine that runs ``dtype`` is built, checked
    against eager fp32 logits (a batch of ``min(batch, 4)`` random inputs) and timed at ``batch`` for about
    ``budget_s`` seconds; the fastest that passes is kept. A named engine is built and checked the same way
    (an engine whose logits are off fails to start). The report names every candidate with its speed, its
    difference from eager and why any was left out."""
    model.eval().requires_grad_(False)
    device = next(model.parameters()).device
    check = reference_batch(model, min(batch, 4), seed=1)
    with torch.inference_mode():
        ref = model.float()(check.to(device)).float().cpu().numpy()
    timing = reference_batch(model, batch)
    auto = engine == "auto"
    names = list(candidates) if auto else [engine]
    # torch last: its bf16 / int8 casts the model in place, which the exporters must not see
    names = sorted(names, key=lambda n: n == "torch")
    report: Dict[str, Any] = {"requested": engine, "dtype": dtype, "batch": batch, "candidates": []}
    best: Optional[Engine] = None
    best_speed = -1.0
    for name in names:
        row: Dict[str, Any] = {"engine": name}
        report["candidates"].append(row)
        eng = _build_candidate(name, model, dtype, auto, device, row)
        if eng is None or not _check_candidate(name, eng, ref, check, dtype, auto, row):
            continue
        if auto or budget_s > 0:
            row.update(time_engine(eng, timing, budget_s))
        speed = row.get("img_per_s", 0.0)
        log.info("engine %s (%s): %.1f img/s at batch %d, logits within %.2g of eager", name, dtype, speed, batch,
                 row["rel_diff"])
        if speed > best_speed:
            if best is not None:
                best.close()
            best, best_speed = eng, speed
        else:
            eng.close()
        gc.collect()
    if best is None:
        raise ConfigError(f"no engine can serve this model in {dtype}: "
                           + "; ".join(f"{r['engine']}: {r.get('skipped')}" for r in report["candidates"]))
    gc.collect()
    _release_freed_memory()
    report["chosen"] = best.name
    if auto:
        log.info("--engine auto chose %s (%s) among %s", best.name, dtype,
                 ", ".join(f"{r['engine']} {r['img_per_s']:.1f} img/s" if "img_per_s" in r else
                           f"{r['engine']} (skipped)" for r in report["candidates"]))
    return best, report
