"""How closely vitkit computes what timm, torchvision, Hugging Face, ONNX Runtime and torch.export compute, with
the same weights; writes docs/figures/checkpoints/agreement.json and prints a table.

    PYTHONPATH=src /work/main/.venv-peers/bin/python benchmarks/agreement.py        # the peers environment

Each reference model is built by its own library (HF ``ViTForImageClassification`` with the B/16 config,
``torchvision.models.vit_b_16()``, ``timm.create_model("vit_base_patch16_224")``, ...); then every parameter
is redrawn from a fixed seed (LayerNorm weights 1 + N(0, 0.1^2), biases N(0, 0.1^2); all other tensors
N(0, 0.02^2)), so that biases and LayerNorm parameters are not at their trivial init and a converter that
mixed them up would show. The reference is saved as its library saves it and read by vitkit's own readers
(``vitkit.load_weights``), never by code from the file. Where vitkit writes the format too, the model is
written back with ``vitkit.save_weights`` and loaded by the reference library into a fresh model.

For every check the JSON holds, at a fixed input (``torch.randn`` with a fixed seed), the largest absolute
difference of the logits and that difference relative to the largest reference logit, |a - b|max / |b|max
(``*_in``: vitkit having read the reference's file vs the reference; ``*_out``: the reference library
having loaded what vitkit wrote vs the original reference), whether the written-back tensors are
identical to the original ones, the configuration, and the bound the test suite holds the same
comparison to. A library that is missing is recorded as a skipped check with the reason. The exit status
is 1 when a check failed to run or exceeded its bound.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "figures" / "checkpoints" / "agreement.json"
sys.path.insert(0, str(ROOT / "src"))

import vitkit  # noqa: E402
from vitkit.bench.machine import machine_info, machine_line  # noqa: E402
from vitkit.checkpoints import load_weights, save_weights  # noqa: E402

STD = 0.02  # redrawn weights, embeddings and heads
NORM_STD = 0.1  # LayerNorm weight 1 + N(0, NORM_STD^2), LayerNorm bias and every bias N(0, NORM_STD^2)
BATCH = 2
PEER_BOUND = {"rel_err": 1e-5, "tests": "the peers tests (max |a-b| / max |ref| < 1e-5)"}
HF_TESTS = "tests/test_checkpoints_hf.py (rel < 1e-5)"
TV_TESTS = "tests/test_checkpoints_torch.py::test_torchvision_vit_b_16_logits, ::test_torchvision_logits_both_ways"
TIMM_TESTS = "tests/test_checkpoints_torch.py::test_timm_logits_both_ways and the timm tests by name (rel < 1e-5)"
EXPORT_BOUND = {"abs_err": 1e-4, "tests": "tests/test_export.py (max |a-b| < 1e-4, vitkit.export.DEFAULT_ATOL)"}
PIXEL_BOUND = {"abs_err": 1e-6, "tests": "tests/test_checkpoints_torch.py (presets: atol 1e-6; timm folders: 0.0)"}


class Skip(Exception):
    """A library the check needs is not installed: the check is recorded as skipped, with this reason."""


def need(module: str):
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise Skip(f"{module} is not installed ({err})") from None


# --- measuring -------------------------------------------------------------------------------------------
def randomize(module: nn.Module, seed: int) -> nn.Module:
    """Redraw every parameter from a fixed seed (LayerNorms around 1, biases and the rest around 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            for name, p in m.named_parameters(recurse=False):
                noise = torch.randn(p.shape, generator=g)
                if isinstance(m, nn.LayerNorm) and name == "weight":
                    p.copy_(1 + NORM_STD * noise)
                elif name.endswith("bias"):
                    p.copy_(NORM_STD * noise)
                else:
                    p.copy_(STD * noise)
    return module.eval()


def images(size: int, seed: int, batch: int = BATCH) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def diff(out: torch.Tensor, ref: torch.Tensor) -> Dict[str, float]:
    out, ref = out.detach().float(), ref.detach().float()
    if out.shape != ref.shape:
        raise RuntimeError(f"logits of shape {list(out.shape)} vs the reference's {list(ref.shape)}")
    abs_err = (out - ref).abs().max().item()
    return {"abs_err": abs_err, "rel_err": abs_err / max(ref.abs().max().item(), 1e-30)}


def same_tensors(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


def result(ref: torch.Tensor, ours: torch.Tensor, back: Optional[torch.Tensor] = None, bound=PEER_BOUND,
           tests: Optional[str] = None, **info: Any) -> Dict[str, Any]:
    """The entry of one check: in (vitkit vs reference), out (reference loading vitkit's file vs reference)."""
    r: Dict[str, Any] = dict(info)
    d_in = diff(ours, ref)
    r.update(rel_err_in=d_in["rel_err"], abs_err_in=d_in["abs_err"], logits_shape=list(ref.shape),
             max_abs_logit=ref.abs().max().item())
    rels, abss = [d_in["rel_err"]], [d_in["abs_err"]]
    if back is not None:
        d_out = diff(back, ref)
        r.update(rel_err_out=d_out["rel_err"], abs_err_out=d_out["abs_err"])
        rels.append(d_out["rel_err"])
        abss.append(d_out["abs_err"])
    r.update(rel_err=max(rels), abs_err=max(abss))
    return with_bound(r, bound, tests)


def with_bound(r: Dict[str, Any], bound: Optional[Dict[str, Any]], tests: Optional[str] = None) -> Dict[str, Any]:
    """The bound the test suite holds this comparison to, where it came from, and whether it held."""
    if bound is None:
        r["bound"], r["within_bound"] = None, None
        return r
    key = "rel_err" if "rel_err" in bound else "abs_err"
    r["bound"] = bound[key]
    r["bound_on"] = key
    r["bound_from"] = tests or bound["tests"]
    r["within_bound"] = bool(r[key] < bound[key])
    return r


def run(model: nn.Module, x: torch.Tensor, hf: bool = False, **kw) -> torch.Tensor:
    with torch.no_grad():
        out = model(pixel_values=x, **kw) if hf else model(x)
    return out.logits if hf else out


# --- Hugging Face -----------------------------------------------------------------------------------------
def _hf_b16(transformers, num_labels=1000):
    cfg = transformers.ViTConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                 intermediate_size=3072, image_size=224, patch_size=16, num_labels=num_labels)
    return randomize(transformers.ViTForImageClassification(cfg), seed=10)


def _hf_config(model) -> Dict[str, Any]:
    c = model.config
    return {"class": type(model).__name__, "hidden_size": c.hidden_size, "num_hidden_layers": c.num_hidden_layers,
            "num_attention_heads": c.num_attention_heads, "intermediate_size": c.intermediate_size,
            "image_size": c.image_size, "patch_size": c.patch_size, "num_labels": c.num_labels,
            "layer_norm_eps": c.layer_norm_eps, "hidden_act": c.hidden_act,
            "attn_implementation": getattr(c, "_attn_implementation", None)}


def _hf_tensors(folder: Path) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    return load_file(str(folder / "model.safetensors"))


def hf_checks(tmp: Path) -> Dict[str, Dict[str, Any]]:
    """HF ViT-B/16 at 224, and at 384 with interpolated positions (bicubic, and vitkit's default bilinear)."""
    transformers = need("transformers")
    transformers.utils.logging.set_verbosity_error()
    ref = _hf_b16(transformers)
    folder = tmp / "hf-ref"
    ref.save_pretrained(folder)
    cfg = _hf_config(ref)
    out: Dict[str, Dict[str, Any]] = {}

    x = images(224, seed=1)
    ours = load_weights(folder)
    back_folder = save_weights(ours, tmp / "hf-back", "hf")
    back = transformers.ViTForImageClassification.from_pretrained(back_folder).eval()
    out["hf_vit_b16_224"] = result(
        run(ref, x, hf=True), run(ours, x), run(back, x, hf=True),
        tests=HF_TESTS + "::test_folder_logits_config_and_labels, ::test_written_back_as_hf_folder",
        what="HF ViTForImageClassification (B/16 config, save_pretrained folder) -> vitkit.load_weights; "
             "vitkit.save_weights(to='hf') -> ViTForImageClassification.from_pretrained",
        config=cfg, input=list(x.shape), tensors_identical_out=same_tensors(_hf_tensors(folder),
                                                                            _hf_tensors(back_folder)))
    del ours, back

    x = images(384, seed=2)
    with torch.no_grad():
        ref384 = ref(pixel_values=x, interpolate_pos_encoding=True).logits
    ours = load_weights(folder, img_size=384, resize="bicubic")
    back_folder = save_weights(ours, tmp / "hf-back-384", "hf")
    back = transformers.ViTForImageClassification.from_pretrained(back_folder).eval()
    out["hf_vit_b16_384_bicubic"] = result(
        ref384, run(ours, x), run(back, x, hf=True),
        tests=HF_TESTS + "::test_loaded_into_384_bicubic_equals_hf_interpolation",
        what="the same folder loaded into a 384 px vitkit model with resize='bicubic' vs HF at 384 px with "
             "interpolate_pos_encoding=True; out: the resized model written as an HF folder, run by HF at 384 px "
             "without interpolation", config=dict(cfg, target_img_size=384, resize="bicubic"), input=list(x.shape))
    del ours, back

    # vitkit's default resize (the authors' bilinear, aligned corners) is another method than HF's bicubic:
    # how far apart the two are, and how exactly the default is scipy.ndimage.zoom(order=1).
    bilinear = load_weights(folder, img_size=384)
    entry = result(ref384, run(bilinear, x), bound=None,
                   what="the same folder loaded at 384 px with vitkit's default resize (the authors' bilinear, "
                        "aligned corners) vs HF's bicubic interpolate_pos_encoding: two methods, not expected "
                        "to agree", config=dict(cfg, target_img_size=384, resize="bilinear"), input=list(x.shape))
    try:
        from scipy import ndimage
        src = ref.vit.embeddings.position_embeddings.detach()[0, 1:].reshape(14, 14, 768).double().numpy()
        zoomed = torch.from_numpy(ndimage.zoom(src, (24 / 14, 24 / 14, 1), order=1))
        pe = bilinear.pos_embed.detach()[0, 1:].reshape(24, 24, 768).double()
        entry["posemb_vs_scipy_zoom_abs_err"] = (pe - zoomed).abs().max().item()
        entry["posemb_vs_scipy_zoom_bound"] = 1e-6
    except ImportError as err:
        entry["posemb_vs_scipy_zoom_abs_err"] = f"skipped: scipy is not installed ({err})"
    out["hf_vit_b16_384_bilinear_vs_hf_bicubic"] = entry
    return out


def hf_deit(tmp: Path) -> Dict[str, Any]:
    """HF DeiTForImageClassificationWithTeacher (DeiT-Ti config): two tokens, the mean of two heads."""
    transformers = need("transformers")
    transformers.utils.logging.set_verbosity_error()
    cfg = transformers.DeiTConfig(hidden_size=192, num_hidden_layers=12, num_attention_heads=3,
                                  intermediate_size=768, image_size=224, patch_size=16, num_labels=1000)
    ref = randomize(transformers.DeiTForImageClassificationWithTeacher(cfg), seed=11)
    ref.save_pretrained(tmp / "deit-ref")
    ours = load_weights(tmp / "deit-ref")
    back_folder = save_weights(ours, tmp / "deit-back", "hf")
    back = transformers.DeiTForImageClassificationWithTeacher.from_pretrained(back_folder).eval()
    x = images(224, seed=3)
    return result(run(ref, x, hf=True), run(ours, x), run(back, x, hf=True),
                  tests="tests/test_hf_equivalence.py::test_deit_logits_and_features_both_ways (rel < 1e-5)",
                  what="HF DeiTForImageClassificationWithTeacher (DeiT-Ti distilled config) -> vitkit; and back",
                  config=dict(_hf_config(ref), vitkit_distill_token=ours.config.distill_token,
                              vitkit_distill_head=ours.config.distill_head), input=list(x.shape),
                  tensors_identical_out=same_tensors(_hf_tensors(tmp / "deit-ref"), _hf_tensors(back_folder)))


# --- torchvision ------------------------------------------------------------------------------------------
def torchvision_check(tmp: Path, pre_logits: bool) -> Dict[str, Any]:
    tvm = need("torchvision.models")
    kw = {"representation_size": 768} if pre_logits else {}
    ref = randomize(tvm.vit_b_16(**kw), seed=20 + pre_logits)
    torch.save(ref.state_dict(), tmp / "tv.pth")
    ours = load_weights(tmp / "tv.pth")
    path = save_weights(ours, tmp / "tv-back.pth", "torchvision")
    written = torch.load(path, weights_only=True)
    back = tvm.vit_b_16(**kw).eval()
    back.load_state_dict(written, strict=True)
    x = images(224, seed=4)
    return result(run(ref, x), run(ours, x), run(back, x), tests=TV_TESTS + " (rel < 1e-5)",
                  what=f"torchvision.models.vit_b_16({'representation_size=768' if pre_logits else ''}) state dict "
                       f"(.pth) -> vitkit.load_weights; vitkit.save_weights(to='torchvision') -> a fresh vit_b_16"
                       f"{'(representation_size=768)' if pre_logits else '()'}.load_state_dict(strict=True)",
                  config={"builder": "torchvision.models.vit_b_16", **kw, "vitkit_num_heads": ours.config.num_heads,
                          "vitkit_representation_size": ours.config.representation_size},
                  input=list(x.shape), tensors_identical_out=same_tensors(ref.state_dict(), written))


# --- timm -------------------------------------------------------------------------------------------------
TIMM_CASES = {
    "timm_vit_tiny_token": ("vit_tiny_patch16_224", {}),
    "timm_vit_tiny_no_embed_class": ("vit_tiny_patch16_224", {"no_embed_class": True}),
    "timm_vit_tiny_gap": ("vit_tiny_patch16_224", {"class_token": False, "global_pool": "avg", "fc_norm": False}),
    "timm_vit_base_patch16_224": ("vit_base_patch16_224", {}),
    "timm_deit_tiny_distilled": ("deit_tiny_distilled_patch16_224", {}),
}


def timm_check(tmp: Path, key: str) -> Dict[str, Any]:
    timm = need("timm")
    from safetensors.torch import load_file
    name, kw = TIMM_CASES[key]
    ref = randomize(timm.create_model(name, pretrained=False, **kw), seed=30 + list(TIMM_CASES).index(key))
    torch.save(ref.state_dict(), tmp / "timm.pth")
    ours = load_weights(tmp / "timm.pth")
    path = save_weights(ours, tmp / "timm-back.safetensors", "timm", safetensors=True)
    written = load_file(str(path))
    back = timm.create_model(name, pretrained=False, **kw).eval()
    back.load_state_dict(written, strict=True)
    x = images(224, seed=5)
    c = ours.config
    return result(run(ref, x), run(ours, x), run(back, x), tests=TIMM_TESTS,
                  what=f"timm.create_model({name!r}{''.join(f', {k}={v!r}' for k, v in kw.items())}) state dict "
                       f"(.pth) -> vitkit.load_weights; vitkit.save_weights(to='timm', safetensors=True) -> a fresh "
                       f"timm model, load_state_dict(strict=True)",
                  config={"timm_model": name, **kw, "timm_class": type(ref).__name__,
                          "vitkit": {"width": c.width, "depth": c.depth, "num_heads": c.num_heads, "pool": c.pool,
                                     "class_token": c.class_token, "distill_token": c.distill_token}},
                  input=list(x.shape), tensors_identical_out=same_tensors(ref.state_dict(), written))


def _photos() -> List[Any]:
    data = need("skimage.data")
    from PIL import Image
    return [Image.fromarray(data.chelsea()), Image.fromarray(data.astronaut()).resize((301, 263))]


TIMM_FOLDERS = {
    "timm_folder_vit_tiny": ("vit_tiny_patch16_224", dict(num_classes=5), None),
    "timm_folder_gap_squash": ("vit_small_patch16_224", dict(num_classes=4, global_pool="avg", class_token=False,
                                                             fc_norm=False, depth=2),
                               {"crop_mode": "squash", "crop_pct": 0.95, "interpolation": "bilinear"}),
    "timm_folder_deit_distilled": ("deit_tiny_distilled_patch16_224", dict(num_classes=3, depth=2),
                                   {"crop_pct": 1.0}),
    "timm_folder_no_embed_class_160": ("vit_base_patch16_224", dict(num_classes=3, depth=1, img_size=160,
                                                                    no_embed_class=True), None),
}


def timm_folder_check(tmp: Path, key: str) -> Dict[str, Any]:
    """timm's save_for_hf folder -> vitkit (logits, pixels); vitkit -> folder -> timm 'local-dir:' (again)."""
    timm = need("timm")
    from timm.data import create_transform, resolve_data_config
    from timm.models import save_for_hf

    from vitkit.data.preprocess import get_preset
    name, kw, data = TIMM_FOLDERS[key]
    photos = _photos()
    ref = randomize(timm.create_model(name, pretrained=False, **kw), seed=40 + list(TIMM_FOLDERS).index(key))
    save_for_hf(ref, tmp / "theirs", safe_serialization=True, data_config=data,
                model_config={"label_names": [f"class {i}" for i in range(kw["num_classes"])]})
    ours = load_weights(tmp / "theirs")
    out = save_weights(ours, tmp / "ours", "timm")
    theirs_cfg = timm.create_model(f"local-dir:{tmp / 'theirs'}", pretrained=False)
    back = timm.create_model(f"local-dir:{out}", pretrained=True).eval()

    def pixels(timm_model) -> float:
        transform = create_transform(**resolve_data_config(model=timm_model))
        return max((transform(p) - get_preset(ours.preprocessing)(p)).abs().max().item() for p in photos)

    x = torch.randn(BATCH, 3, *ours.config.img_size, generator=torch.Generator().manual_seed(6))
    r = result(run(ref, x), run(ours, x), run(back, x),
               tests="tests/test_checkpoints_torch.py::test_timm_folder_both_ways (rel < 1e-5, pixels 0.0)",
               what=f"timm.models.save_for_hf folder of {name} ({kw}) -> vitkit.load_weights; "
                    f"vitkit.save_weights(to='timm') folder -> timm.create_model('local-dir:...', pretrained=True)",
               config={"timm_model": name, **kw, "data_config": data}, input=list(x.shape))
    r["pixels_abs_err_in"] = pixels(theirs_cfg)
    r["pixels_abs_err_out"] = pixels(back)
    r["pixels_bound"] = 0.0
    r["pixels_on"] = "chelsea (451 x 300) and astronaut resized to 301 x 263"
    r["within_bound"] = bool(r["within_bound"] and r["pixels_abs_err_in"] == r["pixels_abs_err_out"] == 0.0)
    return r


def presets_check(tmp: Path) -> Dict[str, Any]:
    """vitkit's presets vs torchvision's weights.transforms() and timm's create_transform, on a photo."""
    import dataclasses
    tvm = need("torchvision.models")
    timm = need("timm")
    from vitkit.data.preprocess import get_preset
    img = _photos()[0]
    errs = {}
    for weights, name in ((tvm.ViT_B_16_Weights.IMAGENET1K_V1, "torchvision"),
                          (tvm.ViT_L_16_Weights.IMAGENET1K_V1, "torchvision"),
                          (tvm.ViT_B_16_Weights.IMAGENET1K_SWAG_E2E_V1, "torchvision-swag")):
        theirs = weights.transforms()(img)
        ours = get_preset(name, theirs.shape[-1])
        if weights is tvm.ViT_L_16_Weights.IMAGENET1K_V1:  # torchvision resizes to 242 for this one
            ours = dataclasses.replace(ours, resize=242)
        errs[f"torchvision {weights}"] = (ours(img) - theirs).abs().max().item()
    model = timm.create_model("vit_base_patch16_224.augreg2_in21k_ft_in1k", pretrained=False)
    theirs = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))(img)
    errs["timm vit_base_patch16_224.augreg2_in21k_ft_in1k create_transform"] = \
        (get_preset("timm")(img) - theirs).abs().max().item()
    r = {"what": "pixels of vitkit's presets vs the libraries' own transforms, on chelsea (451 x 300)",
         "pixels_abs_err": errs, "abs_err": max(errs.values())}
    return with_bound(r, PIXEL_BOUND)


# --- the tests' small configurations ----------------------------------------------------------------------
TINY = dict(img=32, patch=4, width=64, depth=2, heads=4, mlp=128, classes=10)  # tests/test_checkpoints_torch.py


def tiny_check(tmp: Path, library: str) -> Dict[str, Any]:
    """The small models of the peers tests (a few tokens: different kernels than at 224 px may run)."""
    t = TINY
    if library == "timm":
        need("timm")
        from safetensors.torch import load_file
        from timm.models.vision_transformer import VisionTransformer as TimmViT
        kw = dict(img_size=t["img"], patch_size=t["patch"], embed_dim=t["width"], depth=t["depth"],
                  num_heads=t["heads"], mlp_ratio=t["mlp"] / t["width"], num_classes=t["classes"])
        build = lambda: TimmViT(**kw)  # noqa: E731
        write = lambda m: load_file(str(save_weights(m, tmp / "back.safetensors", "timm", safetensors=True)))  # noqa
        size, hf, what = t["img"], False, "timm VisionTransformer"
    elif library == "torchvision":
        tvm = need("torchvision.models")
        kw = dict(image_size=t["img"], patch_size=t["patch"], num_layers=t["depth"], num_heads=t["heads"],
                  hidden_dim=t["width"], mlp_dim=t["mlp"], num_classes=t["classes"])
        build = lambda: tvm.VisionTransformer(**kw)  # noqa: E731
        write = lambda m: torch.load(save_weights(m, tmp / "back.pth", "torchvision"), weights_only=True)  # noqa
        size, hf, what = t["img"], False, "torchvision VisionTransformer"
    else:  # the HF test's model: 224 px, 196 patches, narrow and shallow
        transformers = need("transformers")
        transformers.utils.logging.set_verbosity_error()
        kw = dict(hidden_size=t["width"], num_hidden_layers=t["depth"], num_attention_heads=t["heads"],
                  intermediate_size=t["mlp"], image_size=224, patch_size=16, num_labels=7)
        build = lambda: transformers.ViTForImageClassification(transformers.ViTConfig(**kw))  # noqa: E731
        size, hf, what = 224, True, "HF ViTForImageClassification (tests/test_checkpoints_hf.py's size)"
    ref = randomize(build(), seed=60)
    if hf:
        ref.save_pretrained(tmp / "ref")
        ours = load_weights(tmp / "ref")
        back = type(ref).from_pretrained(save_weights(ours, tmp / "back", "hf")).eval()
        identical = same_tensors(_hf_tensors(tmp / "ref"), _hf_tensors(tmp / "back"))
    else:
        torch.save(ref.state_dict(), tmp / "ref.pth")
        ours = load_weights(tmp / "ref.pth", num_heads=t["heads"])
        back = build().eval()
        written = write(ours)
        back.load_state_dict(written, strict=True)
        identical = same_tensors(ref.state_dict(), written)
    x = images(size, seed=7)
    tests = {"timm": TIMM_TESTS, "torchvision": TV_TESTS + " (rel < 1e-5)",
             "hf": HF_TESTS + "::test_folder_logits_config_and_labels"}[library]
    return result(run(ref, x, hf=hf), run(ours, x), run(back, x, hf=hf), tests=tests,
                  what=f"{what} at the peers tests' small size -> vitkit; and back", config=kw, input=list(x.shape),
                  tensors_identical_out=identical)


# --- export -----------------------------------------------------------------------------------------------
def _export_model():
    return randomize(vitkit.create_model("Ti/16", num_classes=1000), seed=50)


def export_check(tmp: Path, fmt: str) -> Dict[str, Any]:
    from vitkit.export import export_onnx, export_program
    model = _export_model()
    if fmt == "onnx":
        need("onnx")
        need("onnxruntime")
        report = export_onnx(model, tmp / "m.onnx", atol=float("inf"))  # measure; the bound is judged below
        what = "vitkit.export.export_onnx (opset 17, batch traced at 2, run at 3 by onnxruntime) vs eager vitkit"
    else:
        report = export_program(model, tmp / "m.pt2", atol=float("inf"))
        what = "vitkit.export.export_program (torch.export, dynamic batch; saved, reloaded, run at 3) vs eager vitkit"
    c = model.config
    r = {"what": what, "config": {"model": "Ti/16", "img_size": list(c.img_size), "num_classes": c.num_classes},
         "rel_err": report["max_rel_diff"], "abs_err": report["max_abs_diff"], "batch": report["batch"],
         "input_seed": 1, **{k: report[k] for k in ("opset", "validated") if k in report}}
    return with_bound(r, EXPORT_BOUND)


# --- the run ----------------------------------------------------------------------------------------------
def checks() -> Dict[str, Callable[[Path], Any]]:
    c: Dict[str, Callable[[Path], Any]] = {"hf_vit_b16": hf_checks, "hf_deit_tiny_distilled_224": hf_deit,
                                           "torchvision_vit_b_16": lambda t: torchvision_check(t, False),
                                           "torchvision_vit_b_16_pre_logits": lambda t: torchvision_check(t, True)}
    for key in TIMM_CASES:
        c[key] = lambda t, key=key: timm_check(t, key)
    for key in TIMM_FOLDERS:
        c[key] = lambda t, key=key: timm_folder_check(t, key)
    for lib in ("hf", "torchvision", "timm"):
        c[f"{lib}_tiny_test_size"] = lambda t, lib=lib: tiny_check(t, lib)
    c["presets_pixels"] = presets_check
    c["onnx"] = lambda t: export_check(t, "onnx")
    c["torch_export"] = lambda t: export_check(t, "torch")
    return c


GROUPS = {"hf_vit_b16": ["hf_vit_b16_224", "hf_vit_b16_384_bicubic", "hf_vit_b16_384_bilinear_vs_hf_bicubic"]}


def environment() -> Dict[str, Any]:
    env: Dict[str, Any] = {"python_executable": sys.executable, "torch": torch.__version__,
                           "torch_git": torch.version.git_version, "torch_cuda": torch.version.cuda,
                           "torch_debug": torch.version.debug,
                           "torch_parallel": torch.__config__.parallel_info().splitlines()[:3]}
    for dist in ("torchvision", "timm", "transformers", "safetensors", "onnx", "onnxruntime", "numpy", "scipy",
                 "scikit-image", "pillow"):
        try:
            env[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            env[dist] = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=ROOT, capture_output=True,
                               text=True).stdout.strip()
        env["vitkit_commit"] = commit + (" (src modified)" if dirty else "")
    except OSError:
        env["vitkit_commit"] = None
    return env


def _fmt(v: Any) -> str:
    return f"{v:.1e}" if isinstance(v, float) else "-" if v is None else str(v)


def table(results: Dict[str, Dict[str, Any]]) -> str:
    rows = [("check", "rel in", "rel out", "abs max", "bound", "ok")]
    for name, r in results.items():
        if "skipped" in r or "error" in r:
            rows.append((name, "skipped" if "skipped" in r else "ERROR", "", "", "", (r.get("skipped") or
                                                                                   r.get("error", ""))[:60]))
            continue
        bound = "-" if r.get("bound") is None else f"{r['bound_on'].split('_')[0]} < {r['bound']:.0e}"
        ok = {True: "yes", False: "NO", None: "(info)"}[r.get("within_bound")]
        rows.append((name, _fmt(r.get("rel_err_in", r.get("rel_err"))), _fmt(r.get("rel_err_out")),
                     _fmt(r.get("abs_err")), bound, ok))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads (the numbers are recorded with it)")
    ap.add_argument("--only", nargs="+", default=None, help="run only these checks (the JSON then holds only them)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    todo = checks()
    if args.only:
        bad = [n for n in args.only if n not in todo]
        if bad:
            ap.error(f"unknown checks {bad}: choose from {', '.join(todo)}")
        todo = {n: todo[n] for n in args.only}
    results: Dict[str, Dict[str, Any]] = {}
    t_start = time.perf_counter()
    for name, fn in todo.items():
        t0 = time.perf_counter()
        names = GROUPS.get(name, [name])
        with tempfile.TemporaryDirectory(prefix="vitkit-agree-") as tmp:
            try:
                got = fn(Path(tmp))
                got = got if name in GROUPS else {name: got}
            except Skip as why:
                got = {n: {"skipped": str(why)} for n in names}
            except Exception as err:  # noqa: BLE001 - recorded, reported, and the exit status says so
                traceback.print_exc()
                got = {n: {"error": f"{type(err).__name__}: {err}"} for n in names}
        for n, r in got.items():
            r["seconds"] = round(time.perf_counter() - t0, 1)
            results[n] = r
        print(f"{name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    info = machine_info()
    summary = {
        "command": "PYTHONPATH=src " + shlex.join([sys.executable, "benchmarks/agreement.py", *(argv or sys.argv[1:])]),
        "what": "max |a - b| (abs_err) and max |a - b| / max |ref| (rel_err) of fp32 CPU logits; *_in: vitkit "
                "reading the reference's file vs the reference; *_out: the reference loading vitkit's file vs "
                "the reference",
        "init": f"reference models built by their libraries, every parameter redrawn with a fixed seed: LayerNorm "
                f"weight 1 + N(0, {NORM_STD}^2), biases N(0, {NORM_STD}^2), everything else N(0, {STD}^2)",
        "inputs": f"torch.randn({BATCH}, 3, H, W) with a fixed seed per check (export checks: batch 3)",
        "environment": environment(), "machine": info, "machine_line": machine_line(info),
        "seconds": round(time.perf_counter() - t_start, 1), "checks": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"command: {summary['command']}")
    print(summary["machine_line"])
    print(table(results))
    print(f"wrote {args.out}")
    failed = [n for n, r in results.items() if "error" in r or r.get("within_bound") is False]
    if failed:
        print(f"beyond the tests' bounds or failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
