"""The same ViT built in timm, Hugging Face transformers and torchvision, with vitkit's weights; and vitkit's
model exported and run by ONNX Runtime and by OpenVINO (the engines a user would pick instead for CPU
inference).

Each builder takes a vitkit model, builds the peer library's own model of the
same configuration, copies the weights through vitkit's checkpoint writers
(``vitkit.checkpoints.save_weights``) and checks that the logits agree, so a
benchmark compares the same function computed by each library. A library
that is not installed, or cannot express the configuration, raises
:class:`PeerUnavailable` with the reason; the harness prints it and skips
that peer (never a stand-in).
"""
from __future__ import annotations

import functools
import importlib
import importlib.metadata
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
from torch import nn

from ..errors import ConfigError
from ..models import VisionTransformer

PEERS = ("timm", "hf", "torchvision", "onnxruntime", "openvino")
PEER_MODULE = {"timm": "timm", "hf": "transformers", "torchvision": "torchvision", "onnxruntime": "onnxruntime",
               "openvino": "openvino"}  # what each peer imports
# the vitkit extra that installs a peer (timm and torchvision: the peers environment, requirements/peers.txt)
EXTRA = {"hf": "bench", "onnxruntime": "onnx", "openvino": "openvino"}
INFERENCE_ONLY = ("onnxruntime", "openvino")  # runtimes of vitkit's own export: no training, no torch.compile


class PeerUnavailable(RuntimeError):
    """The peer library is missing or cannot build this configuration."""


@dataclass
class Peer:
    library: str  # timm | hf | torchvision
    version: str
    module: nn.Module
    forward: Callable[[torch.Tensor], torch.Tensor]  # images -> logits
    weights: str  # how the weights relate to vitkit's

    @property
    def label(self) -> str:
        return {"hf": "HF", "onnxruntime": "ORT", "openvino": "OpenVINO"}.get(self.library, self.library)


def peer_version(library: str) -> Optional[str]:
    """The installed version of a peer library, or None."""
    if library not in PEER_MODULE:
        raise ConfigError(f"unknown peer {library!r}: use one of {', '.join(PEERS)}")
    try:
        importlib.import_module(PEER_MODULE[library])
    except Exception:  # noqa: BLE001 - a broken install counts as missing
        return None
    try:
        return importlib.metadata.version(PEER_MODULE[library])
    except importlib.metadata.PackageNotFoundError:
        return "?"


def parse_peers(names: Optional[List[str]]) -> List[str]:
    """``None``/``["all"]`` -> every peer; ``["none"]`` -> none; else the names checked."""
    if not names or names == ["all"]:
        return list(PEERS)
    if names == ["none"]:
        return []
    bad = [n for n in names if n not in PEERS]
    if bad:
        raise ConfigError(f"unknown peer(s) {bad}: use some of {', '.join(PEERS)}, 'all' or 'none'")
    return list(dict.fromkeys(names))


# --- configuration checks ---------------------------------------------------------------
def _common_problems(cfg) -> List[str]:
    out = []
    if getattr(cfg, "backbone", None):
        out.append("a hybrid ResNet backbone")
    if cfg.posemb not in ("learn", "none") or cfg.posemb_where != "input":
        out.append(f"posemb={cfg.posemb}/{cfg.posemb_where}")
    return out


def peer_problems(library: str, cfg) -> List[str]:
    """Why ``library`` cannot build the model of ``cfg`` (empty: it can)."""
    if library in INFERENCE_ONLY:  # runs vitkit's own model, exported: every configuration
        return []
    p = _common_problems(cfg)
    if cfg.distill_token and (library == "torchvision" or (library == "timm" and not cfg.distill_head)):
        p.append("a distillation token" + (" read out by the class token only" if library == "timm" else ""))
    if library == "timm":
        if cfg.representation_size:
            p.append("a pre-logits layer")
        return p
    if cfg.posemb != "learn":
        p.append("no position embedding")
    if not cfg.class_token or cfg.pool != "token":
        p.append("no class-token read-out")
    if cfg.representation_size:
        p.append("a pre-logits layer" if library == "hf" else "")
    if cfg.patch_drop:
        p.append("patch dropout")
    if library == "torchvision":
        if cfg.img_size[0] != cfg.img_size[1] or cfg.patch_size[0] != cfg.patch_size[1]:
            p.append("non-square images or patches")
        if not cfg.qkv_bias:
            p.append("no qkv bias")
        if cfg.gelu != "exact" or cfg.ln_eps != 1e-6:
            p.append("tanh GELU or LayerNorm eps != 1e-6")
        if cfg.drop_path:
            p.append("stochastic depth")
        if cfg.num_classes == 0:
            p.append("no head")
    if library == "hf" and cfg.num_classes == 0:
        p.append("no head")
    return [x for x in p if x]


# --- builders ------------------------------------------------------------------------------
def _build_timm(cfg) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer as TimmViT
    if cfg.distill_token:  # DeiT's distilled model: the same arguments
        from timm.models.deit import VisionTransformerDistilled as TimmViT

    act = nn.GELU if cfg.gelu == "exact" else functools.partial(nn.GELU, approximate="tanh")
    return TimmViT(
        img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans, num_classes=cfg.num_classes,
        global_pool="token" if cfg.pool == "token" else "avg", embed_dim=cfg.width, depth=cfg.depth,
        num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_dim / cfg.width, qkv_bias=cfg.qkv_bias,
        class_token=cfg.class_token, pos_embed="learn" if cfg.posemb == "learn" else "none", fc_norm=False,
        drop_rate=cfg.dropout, pos_drop_rate=cfg.dropout, proj_drop_rate=cfg.dropout,
        attn_drop_rate=cfg.attn_dropout, drop_path_rate=cfg.drop_path, patch_drop_rate=cfg.patch_drop,
        norm_layer=functools.partial(nn.LayerNorm, eps=cfg.ln_eps), act_layer=act)


def _hf_class(cfg):
    """HF's model class for ``cfg``, as vitkit's HF writer names it (ViT, or DeiT for a distillation token)."""
    import transformers

    from ..checkpoints.formats.hf import architecture
    return getattr(transformers, architecture(cfg))


def _hf_config(cfg):
    import transformers

    hf = (transformers.DeiTConfig if cfg.distill_token else transformers.ViTConfig)(
        hidden_size=cfg.width, num_hidden_layers=cfg.depth, num_attention_heads=cfg.num_heads,
        intermediate_size=cfg.mlp_dim, hidden_act="gelu" if cfg.gelu == "exact" else "gelu_pytorch_tanh",
        hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.attn_dropout,
        layer_norm_eps=cfg.ln_eps, image_size=list(cfg.img_size), patch_size=list(cfg.patch_size),
        num_channels=cfg.in_chans, qkv_bias=cfg.qkv_bias, num_labels=cfg.num_classes)
    hf._attn_implementation = "sdpa"
    return hf


class OrtModel(nn.Module):
    """vitkit's model exported to ONNX (fp32, opset 17, dynamic batch) in an ONNX Runtime CPU session with
    every graph optimisation and torch's intra-op thread count; maps an image tensor to logits.

    ``quantize="int8"``: ONNX Runtime's dynamic quantisation of the exported graph
    (``onnxruntime.quantization.quantize_dynamic``: int8 weights per tensor, activations quantised per
    call), the semantics of vitkit's ``prepare_inference(model, quantize="int8")``."""

    def __init__(self, model: VisionTransformer, quantize: Optional[str] = None):
        super().__init__()
        import onnxruntime as ort

        from ..export import export_onnx

        if quantize not in (None, "int8"):
            raise ConfigError(f"ONNX Runtime quantisation {quantize!r}: use None or 'int8'")
        with tempfile.TemporaryDirectory(prefix="vitkit-onnx-") as tmp:
            path = str(Path(tmp) / "model.onnx")
            export_onnx(model.float().cpu().eval(), path, opset=17, validate=False)  # vitkit's own exporter
            if quantize == "int8":
                from onnxruntime.quantization import QuantType, quantize_dynamic
                from onnxruntime.quantization.shape_inference import quant_pre_process

                prep, qpath = str(Path(tmp) / "model-prep.onnx"), str(Path(tmp) / "model-int8.onnx")
                quant_pre_process(path, prep)  # shapes and graph clean-up first, as ONNX Runtime advises
                quantize_dynamic(prep, qpath, weight_type=QuantType.QInt8, per_channel=False)
                path = qpath
            so = ort.SessionOptions()
            so.intra_op_num_threads = torch.get_num_threads()
            so.inter_op_num_threads = 1
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            self.session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.session.run(None, {"pixels": x.float().contiguous().numpy()})[0])


class OvModel(nn.Module):
    """vitkit's model as OpenVINO IR (:func:`vitkit.export.export_openvino`, weights in fp32) compiled for the
    CPU plugin with ``INFERENCE_PRECISION_HINT`` ``f32`` or ``bf16`` (OpenVINO's own bf16 kernels; on a CPU
    without bf16 hardware it would run f32, so bf16 is refused there) and torch's thread count; maps an image
    tensor to logits."""

    def __init__(self, model: VisionTransformer, precision: str = "f32"):
        super().__init__()
        import openvino as ov

        from ..export import export_openvino
        from ..models.ops import cpu_has_native_bf16

        if precision not in ("f32", "bf16"):
            raise ConfigError(f"OpenVINO precision {precision!r}: use f32 or bf16")
        if precision == "bf16" and not cpu_has_native_bf16():
            raise PeerUnavailable("OpenVINO runs bf16 natively only on CPUs with bf16 hardware")
        self.precision = precision
        with tempfile.TemporaryDirectory(prefix="vitkit-ov-") as tmp:
            xml = Path(tmp) / "model.xml"
            export_openvino(model.float().cpu().eval(), xml, validate=False)  # vitkit's own exporter
            config = {"INFERENCE_PRECISION_HINT": precision, "PERFORMANCE_HINT": "LATENCY",
                      "INFERENCE_NUM_THREADS": torch.get_num_threads()}
            self.compiled = ov.Core().compile_model(str(xml), "CPU", config)
        self.request = self.compiled.create_infer_request()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.request.infer({"pixels": x.float().contiguous().numpy()})
        return torch.from_numpy(next(iter(out.values())).copy())


def _build_torchvision(cfg) -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer as TvViT

    return TvViT(image_size=cfg.img_size[0], patch_size=cfg.patch_size[0], num_layers=cfg.depth,
                 num_heads=cfg.num_heads, hidden_dim=cfg.width, mlp_dim=cfg.mlp_dim, dropout=cfg.dropout,
                 attention_dropout=cfg.attn_dropout, num_classes=cfg.num_classes)


def _copy_weights(library: str, model: VisionTransformer, peer: Optional[nn.Module]) -> nn.Module:
    """Write vitkit's weights in the peer's layout with vitkit's own converters and load them there."""
    from safetensors.torch import load_file

    from ..checkpoints import save_weights

    with tempfile.TemporaryDirectory(prefix="vitkit-bench-") as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if library == "hf":
            import transformers

            transformers.utils.logging.disable_progress_bar()
            folder = save_weights(model, Path(tmp) / "hf", to="hf")
            return _hf_class(model.config).from_pretrained(str(folder), attn_implementation="sdpa",
                                                           dtype=torch.float32)
        path = save_weights(model, Path(tmp) / f"{library}.safetensors", to=library, safetensors=True)
        peer.load_state_dict(load_file(str(path)), strict=True)
        return peer


def build_peer(library: str, model: VisionTransformer, *, copy_weights: bool = True,
               check: bool = True, precision: str = "f32") -> Peer:
    """The peer library's model of ``model``'s configuration (fp32, on the CPU, eval mode).

    ``copy_weights``: load vitkit's weights (else the peer's own random
    init). ``check``: run both on one random image and report the largest
    logit difference in ``Peer.weights``. ``precision``: OpenVINO's inference precision (f32 or bf16)."""
    version = peer_version(library)
    if version is None:
        how = f": pip install 'vitkit[{EXTRA[library]}]'" if library in EXTRA else ""
        raise PeerUnavailable(f"{library} is not installed ({PEER_MODULE[library]} cannot be imported){how}")
    cfg = model.config
    problems = peer_problems(library, cfg)
    if problems:
        raise PeerUnavailable(f"{library} cannot build this configuration: {', '.join(problems)}")
    src = model.float().cpu().eval()
    if library in INFERENCE_ONLY:  # vitkit's own model, exported: its weights by construction
        module = OrtModel(src) if library == "onnxruntime" else OvModel(src, precision)
        forward = forward_fn(library, module)
        weights = ("vitkit's model exported to ONNX" if library == "onnxruntime" else
                   f"vitkit's model exported to OpenVINO IR, run in {precision}")
        if check:
            weights += _agreement(model, forward, cfg)
        return Peer(library, version, module, forward, weights)
    if library == "hf":

        module = None if copy_weights else _hf_class(cfg)(_hf_config(cfg))
    else:
        module = _build_timm(cfg) if library == "timm" else _build_torchvision(cfg)
    weights = "own random init"
    if copy_weights:
        try:
            module = _copy_weights(library, src, module)
            weights = "vitkit's weights"
        except (ValueError, RuntimeError, KeyError, OSError) as err:
            if module is None:
                raise PeerUnavailable(f"HF model could not be built from vitkit's weights: {err}") from err
            weights = f"own random init (copying vitkit's weights failed: {err})"
    module = module.eval()
    forward = forward_fn(library, module)
    if check and weights == "vitkit's weights":
        weights += _agreement(model, forward, cfg)
    return Peer(library, version, module, forward, weights)


def _agreement(model, forward, cfg) -> str:
    """How closely a peer's logits follow vitkit's on one fixed image (for the peer's description)."""
    x = torch.randn(1, cfg.in_chans, *cfg.img_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref, out = model(x), forward(x)
    diff = (ref - out).abs().max().item() / max(ref.abs().max().item(), 1e-12)
    return f" (logits agree to {diff:.1e} relative)"


def forward_fn(library: str, module: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The call that runs a built peer ``module`` of ``library`` on a batch of pixels and returns its logits."""
    def dtype_of() -> torch.dtype:
        return next(module.parameters()).dtype

    if library == "hf":
        return lambda x: module(pixel_values=x.to(dtype_of())).logits
    if library in INFERENCE_ONLY:
        return lambda x: module(x)
    return lambda x: module(x.to(dtype_of()))


def available(libraries: List[str]) -> Dict[str, Optional[str]]:
    """{library: version or None} for the requested peers."""
    return {lib: peer_version(lib) for lib in libraries}
