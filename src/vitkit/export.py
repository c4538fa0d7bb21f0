"""Export a model for deployment: ONNX (checked with onnxruntime when installed), ``torch.export`` and
OpenVINO IR (checked with OpenVINO's CPU plugin).

Every exporter traces the fused-attention forward at the model's resolution
with a dynamic batch axis, then runs the exported program on fresh inputs and
compares its logits with eager PyTorch; the report gives the largest absolute
and relative differences, and the export fails if they exceed the tolerance.
The ONNX file and the OpenVINO IR carry what vitkit knows of the model (:func:`export_metadata`: labels,
preprocessing, name, architecture, config, origin) as JSON strings: ONNX in ``metadata_props``, OpenVINO
in the IR's ``rt_info`` under ``vitkit``.
OpenVINO reads vitkit's own ONNX graph (the same traced forward), so its IR is
checked against eager, not against the ONNX file.
"""
from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any, Dict, Optional

import torch

from .errors import ConfigError, ExportError, require
from .utils import PathLike, atomic_path

DEFAULT_ATOL = 1e-4  # fp32: exporters may reorder reductions; logits agree to ~1e-6 in practice


def _inputs(model, batch: int, seed: int = 0) -> torch.Tensor:
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, cfg.in_chans, *cfg.img_size, generator=g)


class _PixelsToLogits(torch.nn.Module):
    """The model's forward with the pixels as its only argument: torch.onnx's TorchScript exporter appends
    the defaults of every further forward argument (keyword-only ones too) to the traced inputs, which the
    model's forward would then receive positionally. With ``features``, the pooled pre-logits features too:
    ``(logits, features)``, one pass (what ``vitkit serve`` needs for /v1/embed)."""

    def __init__(self, model, features: bool = False):
        super().__init__()
        self.model = model
        self.features = features

    def forward(self, pixels: torch.Tensor):
        out = self.model.forward_outputs(pixels)  # the head's contract: what eager and `vitkit serve` run
        return (out.logits, out.features) if self.features else out.logits


def _compare(ref: torch.Tensor, out: torch.Tensor, atol: float, what: str) -> Dict[str, float]:
    diff = (ref - out).abs().max().item()
    rel = diff / max(ref.abs().max().item(), 1e-12)
    if not diff <= atol:
        raise ExportError(f"{what} logits differ from eager PyTorch by {diff:.3g} (> {atol:g}): the export is "
                          f"not faithful")
    return {"max_abs_diff": diff, "max_rel_diff": rel}


METADATA_PREFIX = "vitkit."


def export_metadata(model, features: bool = False) -> Dict[str, str]:
    """What vitkit knows of ``model``, as the string values ONNX's ``metadata_props`` and OpenVINO's
    ``rt_info`` hold (JSON where the value is structured): ``vitkit.labels`` (the class names, index order, or
    null), ``vitkit.preprocessing`` (the preset at the model's size, as :meth:`Preset.to_dict` writes it: what
    :func:`vitkit.data.preprocess.get_preset` reads back; null when the model carries none),
    ``vitkit.preprocessing_summary``, ``vitkit.model_name``, ``vitkit.architecture``, ``vitkit.config``,
    ``vitkit.source``, ``vitkit.format``, ``vitkit.input`` / ``vitkit.outputs`` (names, layout, shapes) and
    ``vitkit.version``."""
    from .data.preprocess import get_preset
    from .variants import architecture
    from .version import __version__

    cfg, meta = model.config, model.meta
    pre = get_preset(meta.preprocessing, cfg.img_size) if meta.preprocessing else None
    h, w = cfg.img_size
    outputs = {"logits": ["batch", cfg.num_classes or cfg.representation_size or cfg.width]}
    if features:
        outputs["features"] = ["batch", cfg.representation_size or cfg.width]
    values = {
        "model_name": cfg.name or "", "architecture": architecture(cfg), "config": cfg.to_dict(),
        "labels": list(meta.labels) if meta.labels else None, "preprocessing": pre.to_dict() if pre else None,
        "preprocessing_summary": pre.describe() if pre else "", "source": meta.source or "",
        "format": meta.format or "", "version": __version__,
        "input": {"name": "pixels", "datatype": "FP32", "layout": "NCHW", "shape": ["batch", cfg.in_chans, h, w],
                  "normalised": "with vitkit.preprocessing's mean and std"},
        "outputs": outputs}
    return {METADATA_PREFIX + k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}


def _stamp_onnx(path: Path, metadata: Dict[str, str]) -> None:
    """Write ``metadata`` into the ONNX file's ``metadata_props`` (in place; weights kept as they are)."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    kept = [p for p in proto.metadata_props if p.key not in metadata]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    for key, value in metadata.items():
        proto.metadata_props.add(key=key, value=value)
    onnx.save(proto, str(path))


def export_onnx(model, path: PathLike, *, opset: int = 17, dynamic_batch: bool = True, validate: bool = True,
                atol: float = DEFAULT_ATOL, features: bool = False) -> Dict[str, Any]:
    """Write ``model`` as ONNX (input ``pixels`` [B, C, H, W], output ``logits``; with ``features`` also
    ``features``, the pooled pre-logits features [B, D]), with :func:`export_metadata` in ``metadata_props``.

    With ``validate`` and onnxruntime installed, the file is run on a batch of 3
    random images and compared with eager logits.
    """
    require("onnx", "onnx", what="ONNX export")  # the exporter needs it
    model = model.eval()
    path = Path(path)
    example = _inputs(model, 2)
    outputs = ["logits", "features"] if features else ["logits"]
    axes = {name: {0: "batch"} for name in ["pixels", *outputs]} if dynamic_batch else None
    with atomic_path(path) as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about python-level shape checks
        torch.onnx.export(_PixelsToLogits(model, features), (example,), str(tmp), input_names=["pixels"],
                          output_names=outputs, dynamic_axes=axes, opset_version=opset, dynamo=False,
                          do_constant_folding=True)
        _stamp_onnx(tmp, export_metadata(model, features))
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


def openvino_paths(path: PathLike) -> "tuple[Path, Path]":
    """(model.xml, model.bin) for an OpenVINO output: ``NAME.xml`` (the weights beside it as ``NAME.bin``),
    or a folder that gets ``model.xml`` and ``model.bin``."""
    path = Path(path)
    xml = path if path.suffix.lower() == ".xml" else path / "model.xml"
    return xml, xml.with_suffix(".bin")


def _openvino():
    require("openvino", "onnx", "openvino", what="OpenVINO export")
    import openvino as ov

    return ov


def export_openvino(model, path: PathLike, *, opset: int = 17, dynamic_batch: bool = True, validate: bool = True,
                    atol: float = DEFAULT_ATOL, features: bool = False) -> Dict[str, Any]:
    """Write ``model`` as OpenVINO IR (``.xml`` + ``.bin``; input ``pixels``, output ``logits`` and, with
    ``features``, ``features``), converted from vitkit's ONNX graph, weights kept in fp32;
    :func:`export_metadata` in the IR's ``rt_info`` (``model.get_rt_info(["vitkit", "labels"])``).

    With ``validate``, the IR is compiled for the CPU in fp32 (``INFERENCE_PRECISION_HINT=f32``: OpenVINO
    would otherwise run bf16 on CPUs that have it) and its logits on a batch of 3 random images compared
    with eager PyTorch.
    """
    import tempfile

    ov = _openvino()
    model = model.eval()
    xml, binf = openvino_paths(path)
    xml.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vitkit-ov-") as tmp:
        onnx_file = Path(tmp) / "model.onnx"
        export_onnx(model, onnx_file, opset=opset, dynamic_batch=dynamic_batch, validate=False, features=features)
        ir = ov.convert_model(str(onnx_file))
        for key, value in export_metadata(model, features).items():  # rt_info: <vitkit><labels value=.../>
            ir.set_rt_info(value, ["vitkit", key[len(METADATA_PREFIX):]])
        staged = Path(tmp) / "staged.xml"
        ov.save_model(ir, str(staged), compress_to_fp16=False)
        for src, dst in ((staged.with_suffix(".bin"), binf), (staged, xml)):  # the weights first, then the graph
            with atomic_path(dst) as out:  # (OpenVINO reads NAME.bin beside NAME.xml)
                shutil.copyfile(src, out)
    report: Dict[str, Any] = {"format": "openvino", "path": str(xml), "weights": str(binf),
                              "bytes": xml.stat().st_size + binf.stat().st_size}
    if not validate:
        return report
    compiled = ov.Core().compile_model(str(xml), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    x = _inputs(model, 3 if dynamic_batch else 2, seed=1)
    out = torch.from_numpy(compiled(x.numpy())["logits"])
    with torch.no_grad():
        ref = model(x)
    report.update(_compare(ref, out, atol, "OpenVINO"), validated=f"openvino {ov.__version__} (CPU, f32)",
                  batch=x.shape[0], atol=atol)
    return report


FORMATS = ("onnx", "torch", "openvino")


def export(model, path: PathLike, fmt: Optional[str] = None, **kwargs: Any) -> Dict[str, Any]:
    """Export by format name ("onnx", "torch"/"pt2" or "openvino"); the default follows the file's suffix
    (.onnx, .xml: OpenVINO, else torch.export)."""
    suffix = Path(str(path)).suffix.lower()
    fmt = (fmt or {".onnx": "onnx", ".xml": "openvino"}.get(suffix, "torch")).lower()
    if fmt == "onnx":
        return export_onnx(model, path, **kwargs)
    if fmt in ("openvino", "ov", "ir"):
        return export_openvino(model, path, **kwargs)
    if fmt in ("torch", "pt2", "torch.export", "export"):
        kwargs.pop("opset", None)
        return export_program(model, path, **kwargs)
    raise ConfigError(f"export format {fmt!r}: use 'onnx', 'torch' or 'openvino'")
