"""Hugging Face ``ViTModel`` / ``ViTForImageClassification``: a folder (``config.json`` +
``model.safetensors`` / ``pytorch_model.bin``, possibly sharded) or a raw state dict.

Key names are the classic file layout (``vit.encoder.layer.{i}.attention.attention.query`` ...),
which ``save_pretrained`` still writes; transformers 5's in-memory names
(``vit.layers.{i}.attention.q_proj`` ...) are read too. HF's pooler (dense +
tanh on token 0) is the paper's pre-logits layer. The config carries width,
depth, heads, LayerNorm epsilon (1e-12 in HF configs), GELU flavour, image
and patch size and the labels.

DeiT (``model_type: deit``) is the same backbone under ``deit.`` with a
distillation token: ``DeiTForImageClassificationWithTeacher`` (``cls_classifier``
+ ``distillation_classifier``, logits averaged) becomes a model with
``distill_token=True``; ``DeiTForImageClassification`` (one ``classifier`` on the
class token) and ``DeiTModel`` keep the token but read out the class token only
(``distill_head=False``). DeiTModel's pooler is not part of DeiT and is dropped.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Optional

from ...errors import CheckpointError
from ...utils import write_json_atomic
from ..base import Checkpoint, descendant_parts, heads_note, infer_config, with_class_slots
from ..files import write_safetensors
from ..keymap import QKV_CAT, Context, Rule, check_mapped, count_blocks, from_vitkit, linear, rule, to_vitkit

NAME = "hf"
E = "encoder.layer.{i}."
N = "layers.{i}."  # transformers 5 in-memory names
RULES: List[Rule] = [
    *linear("patch_embed.proj", "embeddings.patch_embeddings.projection"),
    rule("cls_token", "embeddings.cls_token"),
    rule("pos_embed", "embeddings.position_embeddings"),
    *linear("blocks.{i}.norm1", E + "layernorm_before", aliases=[N + "layernorm_before"]),
    rule("blocks.{i}.attn.qkv.weight", [E + f"attention.attention.{n}.weight" for n in ("query", "key", "value")],
         QKV_CAT, aliases=[[N + f"attention.{n}_proj.weight" for n in "qkv"]]),
    rule("blocks.{i}.attn.qkv.bias", [E + f"attention.attention.{n}.bias" for n in ("query", "key", "value")],
         QKV_CAT, aliases=[[N + f"attention.{n}_proj.bias" for n in "qkv"]], optional=True),
    *linear("blocks.{i}.attn.proj", E + "attention.output.dense", aliases=[N + "attention.o_proj"]),
    *linear("blocks.{i}.norm2", E + "layernorm_after", aliases=[N + "layernorm_after"]),
    *linear("blocks.{i}.mlp.fc1", E + "intermediate.dense", aliases=[N + "mlp.fc1"]),
    *linear("blocks.{i}.mlp.fc2", E + "output.dense", aliases=[N + "mlp.fc2"]),
    *linear("norm", "layernorm"),
    *linear("pre_logits.fc", "pooler.dense", optional=True),
    *linear("head", "classifier", optional=True),
]
# DeiT: the backbone's rules (its pooler aside) plus the distillation token and the two-head classifier
_BACKBONE = [r for r in RULES if not r.ours.startswith(("pre_logits.", "head."))]
DEIT_RULES: List[Rule] = _BACKBONE + [rule("dist_token", "embeddings.distillation_token"),
                                      *linear("head", "classifier", optional=True)]
DEIT_TEACHER_RULES: List[Rule] = _BACKBONE + [rule("dist_token", "embeddings.distillation_token"),
                                              *linear("head", "cls_classifier"),
                                              *linear("head_dist", "distillation_classifier")]
RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}  # PIL's codes in preprocessor_config.json
ACTS = {"gelu": "exact", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}
GENERIC_LABEL = re.compile(r"^LABEL_\d+$")


def rules(layout: Optional[Dict[str, Any]] = None) -> List[Rule]:
    return RULES


def strip_prefix(tensors: Dict[str, Any]) -> Dict[str, Any]:
    """ViTForImageClassification keeps the backbone under ``vit.`` (DeiT's under ``deit.``) and the
    classifier at the top."""
    return {(k.split(".", 1)[1] if k.startswith(("vit.", "deit.")) else k): v for k, v in tensors.items()}


def _is_deit(tensors: Dict[str, Any], config: Optional[Dict[str, Any]]) -> bool:
    return "embeddings.distillation_token" in tensors or bool(config and config.get("model_type") == "deit")


def read(tensors: Dict[str, Any], *, config: Optional[Dict[str, Any]] = None, num_heads: Optional[int] = None,
         source: str = "") -> Checkpoint:
    tensors = strip_prefix(tensors)
    depth = max(count_blocks(tensors, E + "layernorm_before.weight"),
                count_blocks(tensors, N + "layernorm_before.weight"))
    notes = []
    deit = _is_deit(tensors, config)
    table = RULES
    if deit:
        teacher = "cls_classifier.weight" in tensors or "distillation_classifier.weight" in tensors
        table = DEIT_TEACHER_RULES if teacher else DEIT_RULES
        pooler = [k for k in tensors if k.startswith("pooler.")]
        if pooler:  # DeiTModel's default pooler: not part of DeiT's classifiers
            tensors = {k: v for k, v in tensors.items() if k not in pooler}
            notes.append("DeiTModel's pooler (dense + tanh on the class token) is not part of DeiT: dropped")
    mapped = to_vitkit(tensors, table, depth, Context(1, 1))
    check_mapped(mapped, source, NAME)
    fixed: Dict[str, Any] = {"ln_eps": 1e-12, "gelu": "exact"}
    if deit:
        fixed["distill_head"] = "head_dist.weight" in mapped.state
    labels = None
    if config:
        if config.get("model_type", "vit") not in ("vit", "deit"):
            raise CheckpointError(f"{source}: config.json is for model_type={config.get('model_type')!r}, "
                                  f"not 'vit' or 'deit'")
        act = config.get("hidden_act", "gelu")
        if act not in ACTS:
            raise CheckpointError(f"{source}: hidden_act={act!r} is not a GELU; vitkit's ViT supports {sorted(ACTS)}")
        fixed.update(ln_eps=float(config.get("layer_norm_eps", 1e-12)), gelu=ACTS[act])
        heads = int(config.get("num_attention_heads", 0)) or None
        num_heads = num_heads or heads
        size = config.get("image_size")
        if size is not None:
            fixed["img_size"] = size
        labels = labels_from_config(config, mapped.state)
    else:
        notes.append("no config.json: LayerNorm eps 1e-12 and exact GELU (HF's defaults) assumed")
    cfg = infer_config(mapped.state, num_heads=num_heads, **fixed)
    if not num_heads:
        notes.append(heads_note(cfg))
    if config and int(config.get("patch_size", cfg.patch_size[0])) != cfg.patch_size[0]:
        raise CheckpointError(f"{source}: config.json says patch_size={config['patch_size']} but the weights have "
                              f"{cfg.patch_size[0]}: the folder mixes two models")
    return Checkpoint(mapped.state, cfg, NAME, labels=labels, preprocessing=preprocessing(cfg),
                      layout={"flavour": "hf", "model_type": "deit" if deit else "vit",
                              "model_class": "classification" if "head.weight" in mapped.state else "model"},
                      source=source, notes=notes,
                      assumed=(() if config else ("ln_eps", "gelu")) + (() if num_heads else ("num_heads",)))


def labels_from_config(config: Dict[str, Any], state) -> Optional[List[str]]:
    id2label = config.get("id2label") or {}
    n = int(state["head.weight"].shape[0]) if "head.weight" in state else 0
    if not id2label or not n or len(id2label) != n:
        return None
    names = [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(n)]
    return None if all(GENERIC_LABEL.match(x) for x in names) else names


def preprocessing(cfg) -> Dict[str, Any]:
    from ...data.preprocess import get_preset
    return get_preset("hf", cfg.img_size).to_dict()


def architecture(cfg) -> str:
    """The transformers class of a model: ViT, or DeiT for a distillation token (with teacher = two heads);
    the ``...Model`` class when it has no head."""
    if not cfg.distill_token:
        return "ViTForImageClassification" if cfg.num_classes else "ViTModel"
    if not cfg.num_classes:
        return "DeiTModel"
    return "DeiTForImageClassificationWithTeacher" if cfg.distill_head else "DeiTForImageClassification"


def write(ckpt: Checkpoint, dst: Path, **_: Any) -> Path:
    """Write a ``save_pretrained``-style folder: config.json, model.safetensors, preprocessor_config.json.
    DINOv2, CLIP and SigLIP towers go to their own classes (:mod:`.hf_towers`)."""
    cfg = ckpt.config
    from . import hf_towers
    if hf_towers.kind_of_config(cfg):
        folder = hf_towers.write(ckpt, dst)
        _write_processor(ckpt, folder)
        return folder
    problems = _problems(cfg)
    if problems:
        raise CheckpointError(f"Hugging Face's ViT needs {'; '.join(problems)}: this model cannot be written as an "
                              f"HF folder")
    deit, classify = cfg.distill_token, cfg.num_classes > 0
    arch = architecture(cfg)
    if deit:
        table = DEIT_TEACHER_RULES if cfg.distill_head and classify else DEIT_RULES
        top = ("classifier", "cls_classifier", "distillation_classifier")
    else:
        table, top = RULES, ("classifier",)
    mapped = from_vitkit(with_class_slots(ckpt.state, cfg), table, cfg.depth, Context(cfg.width, cfg.num_heads))
    if mapped.unused:
        raise CheckpointError(f"Hugging Face's {arch} has no place for {mapped.unused}")
    prefix = "deit." if deit else "vit."
    state = {(k if k.startswith(top) or not classify else prefix + k): v for k, v in mapped.state.items()}
    folder = Path(dst)
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(state, folder / "model.safetensors", metadata={"format": "pt"})
    write_json_atomic(folder / "config.json", _config_json(cfg, arch, ckpt.labels))
    _write_processor(ckpt, folder)
    return folder


def _problems(cfg) -> List[str]:
    """What a model lacks to be Hugging Face's ViT or DeiT (empty: it can be written)."""
    problems = []
    if not cfg.class_token or cfg.pool != "token":
        problems.append("a class token read-out")
    if cfg.posemb != "learn" or cfg.posemb_where != "input":
        problems.append("learned 1D position embeddings at the input")
    if cfg.representation_size and cfg.num_classes:
        problems.append("no pre-logits layer under a classifier (HF's pooler is only in ViTModel, which has no "
                        "classifier); drop it with representation_size=None or num_classes=0")
    if cfg.representation_size and cfg.representation_size != cfg.width:
        problems.append("a pooler as wide as the model")
    if cfg.img_size[0] != cfg.img_size[1] or cfg.patch_size[0] != cfg.patch_size[1]:
        problems.append("square images and patches")
    if cfg.backbone:
        problems.append("no hybrid ResNet backbone (write hybrids as vitkit, npz or timm)")
    if descendant_parts(cfg):
        problems.append(f"none of {', '.join(descendant_parts(cfg))} (HF's ViT is the paper's; DINOv2, CLIP and "
                        f"SigLIP towers are written as theirs)")
    return problems


def _config_json(cfg, arch: str, labels: Optional[List[str]]) -> Dict[str, Any]:
    """config.json of a ViT or DeiT folder, with the labels of a classifier (``LABEL_i`` when none are known)."""
    config = {
        "architectures": [arch], "model_type": "deit" if cfg.distill_token else "vit",
        "hidden_size": cfg.width, "num_hidden_layers": cfg.depth, "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim, "hidden_act": "gelu" if cfg.gelu == "exact" else "gelu_pytorch_tanh",
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "initializer_range": 0.02,
        "layer_norm_eps": cfg.ln_eps, "image_size": cfg.img_size[0], "patch_size": cfg.patch_size[0],
        "num_channels": cfg.in_chans, "qkv_bias": cfg.qkv_bias, "encoder_stride": cfg.patch_size[0],
        "pooler_output_size": cfg.width, "pooler_act": "tanh", "torch_dtype": "float32",
    }
    if cfg.num_classes > 0:
        labels = labels or [f"LABEL_{i}" for i in range(cfg.num_classes)]
        config["id2label"] = {str(i): name for i, name in enumerate(labels)}
        config["label2id"] = {name: i for i, name in enumerate(labels)}
    return config


def _write_processor(ckpt: Checkpoint, folder: Path) -> None:
    """preprocessor_config.json: the image processor that computes the checkpoint's preprocessing."""
    from ...data.preprocess import get_preset
    cfg = ckpt.config
    pre = get_preset(ckpt.preprocessing) if ckpt.preprocessing else get_preset("hf", cfg.img_size)
    resample = {name: code for code, name in RESAMPLE.items()}[pre.interpolation]
    processor = {"image_processor_type": "ViTImageProcessor", "do_resize": True,
                 "size": {"height": pre.size[0], "width": pre.size[1]}}
    crop = {"do_center_crop": True, "crop_size": {"height": pre.size[0], "width": pre.size[1]}}
    if pre.resize_mode == "square":  # a fixed square, then the crop: DeiTImageProcessor's pipeline
        processor = {"image_processor_type": "DeiTImageProcessor", "do_resize": True,
                     "size": {"height": pre.resize, "width": pre.resize}, **crop}
    elif pre.resize_mode == "shorter":  # shorter side, then the crop: BitImageProcessor's pipeline
        processor = {"image_processor_type": "BitImageProcessor", "do_resize": True,
                     "size": {"shortest_edge": pre.resize}, **crop, "do_convert_rgb": True}
    write_json_atomic(folder / "preprocessor_config.json", {
        **processor, "resample": resample, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": list(pre.mean), "image_std": list(pre.std)})
