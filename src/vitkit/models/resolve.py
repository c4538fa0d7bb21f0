"""What the declared backend resolves to on this machine, for one model's shapes (``vitkit backend``)."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

import torch

from ..config import config_from_name
from . import backend, kernels, precision, tune


def _gemm_rows(dtype: torch.dtype, measure: bool) -> List[Dict[str, Any]]:
    name = str(dtype).replace("torch.", "")
    declared = backend.current().gemm
    if measure and declared == "auto" and kernels.onednn_ok(dtype):
        for op in kernels.OPS:
            kernels.calibrate(dtype, op)
    rows = []
    for op, v in kernels.summary(dtype, "cpu").items():
        entry = backend.read_cache().get(backend.cache_key(kernels.gemm_what(dtype, op))) or {}
        meas = (f"ATen/oneDNN time {entry['ratio']:.2f}x, needs >= {kernels.MIN_GAIN}x for oneDNN"
                if "ratio" in entry else None)
        rows.append({"what": f"gemm {op} {name}", "choice": v["kernel"], "why": v["why"], "measurement": meas})
    return rows


def _attention_rows(model: str, batch: int, dtype: torch.dtype, measure: bool) -> List[Dict[str, Any]]:
    cfg = config_from_name(model)
    heads, dim = cfg.num_heads, cfg.width // cfg.num_heads
    tokens = cfg.num_patches + cfg.num_prefix_tokens
    name = str(dtype).replace("torch.", "")
    rows = []
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            qkv = torch.zeros(batch * tokens, 3 * heads * dim, dtype=dtype, requires_grad=grad)
            q, k, _ = precision.split_heads(qkv, batch, tokens, heads, dim)
            what = precision.attention_what(q, k, grad)
        entry = backend.read_cache().get(backend.cache_key(what))
        declared = backend.current().attention
        if declared != "auto":
            choice, why = precision.settle_attention(cfg, dtype, grad, batch), "declared"
        elif measure or precision.decided_attention(what) or entry:
            choice = precision.settle_attention(cfg, dtype, grad, batch)  # measures (and caches) when nothing is known
            why = "measured"
            entry = backend.read_cache().get(backend.cache_key(what)) or entry
        else:
            choice, why = None, "not measured yet"
        meas = (f"fused/explicit time {entry['ratio']:.2f}x (> 1: explicit faster)"
                if entry and "ratio" in entry else None)
        rows.append({"what": f"attention {name} {'training' if grad else 'inference'} {model} x{batch}",
                     "choice": choice, "why": why, "measurement": meas})
    return rows


def _encoder_rows(model: str, dtype: torch.dtype, measure: bool) -> List[Dict[str, Any]]:
    """The libraries of ``model``'s encoder GEMMs in inference and in training (timed on blocks of its shape)."""
    cfg = config_from_name(model)
    name = str(dtype).replace("torch.", "")
    rows = []
    cpu = torch.device("cpu")
    for mode, shape, decide in (
            ("inference", tune.encoder_shape(cfg, dtype), lambda s: tune.encoder_gemm(dtype, cpu, *s) or "aten"),
            ("training", tune.training_shape(cfg),
             lambda s: kernels.mix_name(tune.encoder_training_gemms(dtype, cpu, *s)))):
        what = tune.encoder_what(dtype, *shape, mode=mode)
        entry = backend.read_cache().get(backend.cache_key(what))
        if backend.current().gemm != "auto" or not kernels.onednn_ok(dtype):
            choice, why = decide(shape), "declared"
        elif measure or entry:
            choice = decide(shape)  # measures (and caches) when nothing is known
            why = "cached measurement" if entry else "measured"
            entry = backend.read_cache().get(backend.cache_key(what)) or entry
        else:
            choice, why = None, "not measured yet"
        if not kernels.onednn_ok(dtype):
            why = "only ATen runs this dtype here"
        rows.append({"what": f"gemm encoder {name} {mode} {model}", "choice": choice, "why": why,
                     "measurement": _encoder_measurement(mode, entry)})
    return rows


def _encoder_measurement(mode: str, entry: Optional[dict]) -> Optional[str]:
    """The block timing behind an encoder's GEMM choice, in words (None where nothing was timed)."""
    if not entry or "ratio" not in entry:
        return None
    if mode == "inference":
        return (f"ATen/oneDNN time of {entry.get('depth', tune.DEPTH)} blocks {entry['ratio']:.2f}x, "
                f"needs >= {tune.MIN_GAIN}x for oneDNN")
    mixes = ", ".join(f"{k} {v['ratio']:.2f}x" for k, v in entry.get("mixes", {}).items())
    return f"F.linear/mix time of a block's forward + backward: {mixes}; needs >= {tune.MIN_GAIN}x"


def resolve_backend(model: str = "B/16", batch: int = 16, measure: bool = False) -> Dict[str, Any]:
    """The declared backend, its source, and per choice (GEMM products per dtype, attention for ``model`` at
    ``batch`` images per call in inference and training, the int8 engine) what runs and why."""
    from ..bench.machine import hardware

    declared = backend.current()
    env = os.environ.get(backend.ENV)
    dtypes = [torch.float32] + ([torch.bfloat16] if backend.cpu_has_native_bf16() else [])
    rows: List[Dict[str, Any]] = []
    for dt in dtypes:
        rows += _gemm_rows(dt, measure) + _encoder_rows(model, dt, measure)
    for dt in dtypes + ([] if backend.cpu_has_native_bf16() else [torch.bfloat16]):
        rows += _attention_rows(model, batch, dt, measure)
    if declared.int8 != "auto" or measure:
        rows.append({"what": "int8 engine", "choice": kernels.int8_engine(), "why": "declared"
                     if declared.int8 != "auto" else "measured"})
    else:
        cached = backend.read_cache().get(backend.cache_key(f"int8 engine (default {torch.backends.quantized.engine})"))
        rows.append({"what": "int8 engine", "choice": cached["choice"] if cached else None,
                     "why": "cached measurement" if cached else "not measured yet"})
    report = {**backend.record(), "machine": hardware(), "choices": rows, "cache": str(backend.cache_path())}
    if env:
        fixed = backend.from_environment()
        report["environment"] = {"variable": backend.ENV, "value": env,
                                 "fixes": [f"{k}={v}" for k, v in vars(fixed).items() if v != "auto"]}
    return report
