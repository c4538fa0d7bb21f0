"""Ready a model for inference: a thin convenience around the model's own forward pass.

The fast inference path is the model itself: ``model.eval()`` called under
``torch.inference_mode()`` (or ``torch.no_grad()``) runs the same modules as
training with the inference kernels (:mod:`vitkit.models.layers`: GEMMs
without autograd on the declared library, GELU in place, chunks of whole
images, the patch embedding as one GEMM, the last block only for the tokens
the head reads), as the model's bound kernel plan says (:mod:`vitkit.models.kernel_plan`).
:func:`prepare_inference` only does what a caller would otherwise type, and plans the kernels for it:

- casts the weights to ``dtype`` (``bf16`` runs native bf16 GEMMs where the
  hardware has them - AVX-512-BF16 / AMX CPUs, CUDA - and widens bf16
  operands exactly to fp32 on CPUs without, see :mod:`vitkit.models.ops`);
- binds a kernel plan for that dtype and device (:func:`vitkit.models.planner.plan`: the declared backend,
  the measurements kept for this machine, and a timing of the model's shape for any ``auto`` choice no
  measurement covers yet; ``measure=False`` skips the timing);
- ``quantize="int8"`` (CPU): swaps every encoder Linear for torch's dynamic
  int8 Linear (per-tensor weights, activations quantised per call). It
  changes the numbers: measure its accuracy before use;
- ``compile=True``: ``torch.compile`` of the model (with inductor's weight
  freezing on a CPU), measured in docs/performance.md;
- wraps the call in ``torch.inference_mode()`` and casts the input to the
  model's dtype.
"""
from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Union

import torch
from torch import nn

from ..errors import ConfigError
from .kernel_plan import source as backend_source
from .ops import cpu_has_native_bf16, pack_int8
from .planner import plan as plan_kernels
from .vit import VisionTransformer

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


def resolve_dtype(dtype: Union[str, torch.dtype]) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[str(dtype).lower()]
    except KeyError:
        raise ConfigError(f"unknown dtype {dtype!r}: use one of fp32, bf16, fp16") from None


def native_low_precision_matmul(dtype: torch.dtype, device: Union[str, torch.device] = "cpu") -> bool:
    """Whether ``dtype`` GEMMs run on dedicated hardware on ``device`` (else vitkit widens them to fp32)."""
    if dtype == torch.float32:
        return True
    if torch.device(device).type == "cuda":
        return torch.cuda.is_available()
    if dtype == torch.bfloat16:
        return cpu_has_native_bf16()
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError):
        return False


def quantize_int8_(model: VisionTransformer, engine: Optional[str] = None) -> VisionTransformer:
    """Swap each encoder block's Linear layers for dynamic int8 ones, in place (CPU, fp32 activations), their
    weights packed for ``engine`` (default: the model's kernel plan's ``int8`` engine)."""
    engine = engine or model.kernel_plan.int8
    with warnings.catch_warnings():  # torch.ao's eager quantisation is deprecated in favour of torchao
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic

        pack_int8(lambda: quantize_dynamic(model.blocks, {nn.Linear}, dtype=torch.qint8, inplace=True), engine)
    model._int8_engine = engine
    return model


class Prepared(nn.Module):
    """The model (optionally compiled) under ``torch.inference_mode``, the input cast to its dtype."""

    def __init__(self, model: VisionTransformer, compiled: Optional[Any] = None, quantize: Optional[str] = None):
        super().__init__()
        self.model = model
        self._compiled = compiled
        self.quantize = quantize

    @property
    def config(self):
        return self.model.config

    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        fn = self._compiled if self._compiled is not None else self.model
        with torch.inference_mode():
            return fn(images.to(self.dtype))


def prepare_inference(model: VisionTransformer, dtype: Union[str, torch.dtype] = "fp32", *,
                      device: Union[None, str, torch.device] = None, compile: bool = False,
                      quantize: Optional[str] = None, compile_mode: Optional[str] = None, measure: bool = True
                      ) -> Prepared:
    """``model`` in eval mode, cast to ``dtype`` (in place), its kernels planned (timing what is not known yet
    unless ``measure=False``), optionally int8-quantised or compiled; the returned module maps images (any
    float dtype) to logits under ``torch.inference_mode``."""
    if not isinstance(model, VisionTransformer):
        raise ConfigError(f"prepare_inference takes a vitkit VisionTransformer, got {type(model).__name__}")
    if model.config.attention != "global":
        raise ConfigError(f"prepare_inference streamlines global attention; an attention={model.config.attention!r} "
                         f"model runs its own forward: model.eval()(x) under torch.inference_mode()")
    dt = resolve_dtype(dtype)
    model = model.eval().requires_grad_(False)
    if device is not None:
        model = model.to(device)
    dev = next(model.parameters()).device
    if quantize is not None:
        if quantize != "int8":
            raise ConfigError(f"unknown quantize={quantize!r}: use None or 'int8'")
        if dev.type != "cpu":
            raise ConfigError("int8 dynamic quantisation runs on the CPU: pass device='cpu'")
        if dt != torch.float32:
            raise ConfigError("int8 quantisation takes fp32 activations: use dtype='fp32' with quantize='int8'")
        if compile:
            raise ConfigError("int8 quantisation runs eagerly: drop compile=True")
    model = model.to(dt)
    model.set_kernel_plan(plan_kernels(model.config, dt, dev, quantized=bool(quantize), measure=measure))
    if quantize:
        quantize_int8_(model)
    compiled = torch.compile(model, mode=compile_mode) if compile else None
    return Prepared(model, compiled, quantize)


def inference_summary(module: nn.Module) -> Dict[str, Any]:
    """What a prepared module does (for benchmark reports): dtype, bf16 path, compile, int8, the kernel plan."""
    model = module.model if isinstance(module, Prepared) else module
    dt = model.norm.weight.dtype
    dev = model.norm.weight.device
    return {"engine": "model.eval() under inference_mode",
            "compiled": isinstance(module, Prepared) and module._compiled is not None,
            "quantize": module.quantize if isinstance(module, Prepared) else None,
            "int8_engine": getattr(model, "_int8_engine", None),
            "dtype": str(dt).replace("torch.", ""),
            "bf16_path": None if dt != torch.bfloat16 else
            ("native" if native_low_precision_matmul(dt, dev) else "widened to fp32"),
            "backend_source": backend_source(), "kernel_plan": model.kernel_plan.as_dict()}


__all__: List[str] = ["Prepared", "inference_summary", "native_low_precision_matmul", "prepare_inference",
                      "quantize_int8_", "resolve_dtype"]
