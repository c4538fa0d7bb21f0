"""Export a model for deployment: ONNX (checked with onnxruntime when installed) and ``torch.export``.

Both exporters trace the fused-attention forward at the model's resolution
with a dynamic batch axis, then run the exported program on fresh inputs and
compare its logits with eager PyTorch; the report gives the largest absolute
and relative differences, and the export fails if they exceed the tolerance.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Dict, Optional

import torch

from .utils import PathLike, atomic_path
from .errors import ConfigError, ExportError, require

DEFAULT_ATOL = 1e-4  # fp32: exporters may reorder reductions; logits agree to ~1e-6 in practice


def _inputs(model, batch: int, seed: int = 0) -> torch.Tensor:
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, cfg.in_chans, *cfg.img_size, generator=g)


class _PixelsToLogits(torch.nn.Module):
    """The model's forward with the pixels as its only argument: torch.onnx's TorchScript exporter appends
    the defaults of every further forward argument (keyword-only ones too) to the traced inputs, which the
    model's forward would then receive positionally."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.model(pixels)


def _compare(ref: torch.Tensor, out: torch.Tensor, atol: float, what: str) -> Dict[str, float]:
    diff = (ref - out).abs().max().item()
    rel = diff / max(ref.abs().max().item(), 1e-12)
    if not diff <= atol:
        raise ExportError(f"{what} logits differ from eager PyTorch by {diff:.3g} (> {atol:g}): the export is "
                          f"not faithful")
    return {"max_abs_diff": diff, "max_rel_diff": rel}


def export_onnx(model, path: PathLike, *, opset: int = 17, dynamic_batch: bool = True, validate: bool = True,
                atol: float = DEFAULT_ATOL) -> Dict[str, Any]:
    """Write ``model`` as ONNX (input ``pixels`` [B, C, H, W], output ``logits``).

    With ``validate`` and onnxruntime installed, the file is run on a batch of 3
    random images and compared with eager logits.
    """
    require("onnx", "onnx", what="ONNX export")  # the exporter needs it
    model = model.eval()
    path = Path(path)
    example = _inputs(model, 2)
    axes = {"pixels": {0: "batch"}, "logits": {0: "batch"}} if dynamic_batch else None
    with atomic_path(path) as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about python-level shape checks
        torch.onnx.export(_PixelsToLogits(model), (example,), str(tmp), input_names=["pixels"],
                          output_names=["logits"], dynamic_axes=axes, opset_version=opset, dynamo=False,
                          do_constant_folding=True)
    report: Dict[str, Any] = {"format": "onnx", "path": str(path), "opset": opset, "bytes": path.stat().st_size}
    if not validate:
        return report
    try:
        import onnxruntime as ort
    except ImportError:
        report["validated"] = "skipped: onnxruntime is not installed (pip install 'vitkit[onnx]')"
        return report
    x = _inputs(model, 3 if dynamic_batch else 2, seed=1)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out = torch.from_numpy(sess.run(["logits"], {"pixels": x.numpy()})[0])
    with torch.no_grad():
        ref = model(x)
    report.update(_compare(ref, out, atol, "ONNX Runtime"), validated=f"onnxruntime {ort.__version__}",
                  batch=x.shape[0], atol=atol)
    return report


def export_program(model, path: PathLike, *, dynamic_batch: bool = True, validate: bool = True,
                   atol: float = DEFAULT_ATOL) -> Dict[str, Any]:
    """``torch.export`` the model and save the program (``.pt2``; reload with ``torch.export.load``)."""
    model = model.eval()
    path = Path(path)
    example = _inputs(model, 2)
    dyn = {"x": {0: torch.export.Dim("batch", min=1, max=4096)}} if dynamic_batch else None
    with torch.no_grad():
        program = torch.export.export(model, (example,), dynamic_shapes=dyn)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.export.save(program, f)
    report: Dict[str, Any] = {"format": "torch.export", "path": str(path), "bytes": path.stat().st_size}
    if validate:
        loaded = torch.export.load(str(path)).module()
        x = _inputs(model, 3 if dynamic_batch else 2, seed=1)
        with torch.no_grad():
            ref, out = model(x), loaded(x)
        report.update(_compare(ref, out, atol, "torch.export"), batch=x.shape[0], atol=atol)
    return report


def export(model, path: PathLike, fmt: Optional[str] = None, **kwargs: Any) -> Dict[str, Any]:
    """Export by format name ("onnx" or "torch"/"pt2"); the default follows the file's suffix."""
    fmt = (fmt or ("onnx" if str(path).endswith(".onnx") else "torch")).lower()
    if fmt == "onnx":
        return export_onnx(model, path, **kwargs)
    if fmt in ("torch", "pt2", "torch.export", "export"):
        return export_program(model, path, **kwargs)
    raise ConfigError(f"export format {fmt!r}: use 'onnx' or 'torch'")
