"""Known pretrained checkpoints: where each file comes from and how it must be used.

Like torchvision's weight metadata, each entry carries the resolution, the
preprocessing preset, the label set and the accuracy its publishers report;
:mod:`vitkit.checkpoints.sources` fetches it (or finds it in a cache).
``sha256`` holds what the publisher states: torchvision file names carry the
first 8 hex digits of the file's SHA-256, checked after every download; the
others publish none. ``aliases`` are other names people use for the same
weights (torchvision's enum names, ``ViT_B_16_Weights.IMAGENET1K_V1``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

DEFAULT_CACHE = Path("~/.cache/vitkit/checkpoints")


@dataclass(frozen=True)
class KnownCheckpoint:
    name: str
    source: str  # torchvision | vit_jax | big_vision | hf | timm
    file: str  # the file (or folder, for hf) to put in the cache
    url: str  # where people who are online fetch it
    model: str  # vitkit model name (config)
    img_size: int
    preset: str  # preprocessing preset; "" = the one the folder's config describes (Hub folders)
    labels: str  # imagenet1k | imagenet21k
    num_classes: int
    params: Optional[int] = None  # reported parameter count
    top1: Optional[float] = None  # reported ImageNet-1k top-1 (%)
    top5: Optional[float] = None
    sha256: Optional[str] = None  # full digest or published prefix
    representation_size: Optional[int] = None
    reference: str = ""
    aliases: Tuple[str, ...] = ()

    @property
    def hub_repo(self) -> Optional[str]:
        """The Hugging Face Hub repository the weights live in (hf and timm entries), else None."""
        if self.source == "hf":
            return self.name[len("hf/"):]
        if self.source == "timm":
            return self.name
        return None

    def to_dict(self) -> Dict[str, Any]:
        """The entry as plain JSON values (``vitkit weights NAME --json``)."""
        return asdict(self)


TV = "https://download.pytorch.org/models/"
JAX = "https://storage.googleapis.com/vit_models/"
HF = "https://huggingface.co/"
_TV_DOC = "torchvision.models.ViT_*_Weights"


# torchvision's ViT weights, one a line: torchvision/NAME, the file, the model, its px, the preprocessing preset,
# the parameters, top-1 and top-5, and the enum member IMAGENET1K_TAG (TAG* also is the model's DEFAULT)
_TV_TABLE = """
    vit_b_16             vit_b_16-c867db91.pth         B/16 224 torchvision       86567656 81.072 95.318 V1*
    vit_b_16-swag-e2e    vit_b_16_swag-9ac1b537.pth    B/16 384 torchvision-swag  86859496 85.304 97.650 SWAG_E2E_V1
    vit_b_16-swag-linear vit_b_16_lc_swag-4e70ced5.pth B/16 224 torchvision-swag  86567656 81.886 96.180 SWAG_LINEAR_V1
    vit_b_32             vit_b_32-d86f8d99.pth         B/32 224 torchvision       88224232 75.912 92.466 V1*
    vit_l_16             vit_l_16-852ce7e3.pth         L/16 224 torchvision      304326632 79.662 94.638 V1*
    vit_l_16-swag-e2e    vit_l_16_swag-4f3808c9.pth    L/16 512 torchvision-swag 305174504 88.064 98.512 SWAG_E2E_V1
    vit_l_16-swag-linear vit_l_16_lc_swag-4d563306.pth L/16 224 torchvision-swag 304326632 85.146 97.422 SWAG_LINEAR_V1
    vit_l_32             vit_l_32-c7638314.pth         L/32 224 torchvision      306535400 76.972 93.07  V1*
    vit_h_14-swag-e2e    vit_h_14_swag-80465313.pth    H/14 518 torchvision-swag 633470440 88.552 98.694 SWAG_E2E_V1*
    vit_h_14-swag-linear vit_h_14_lc_swag-c1eb923e.pth H/14 224 torchvision-swag 632045800 85.708 97.730 SWAG_LINEAR_V1
"""


def _torchvision() -> List[KnownCheckpoint]:
    """The entries of :data:`_TV_TABLE`; the file name's hex digits are the published SHA-256 prefix."""
    out = []
    for line in _TV_TABLE.strip().splitlines():
        name, file, model, size, preset, params, top1, top5, tag = line.split()
        cls = f"ViT_{model.replace('/', '_')}_Weights"  # torchvision's enum: ViT_B_16_Weights.IMAGENET1K_V1
        aliases = (f"{cls}.IMAGENET1K_{tag.rstrip('*')}",) + ((f"{cls}.DEFAULT",) if tag.endswith("*") else ())
        out.append(KnownCheckpoint(f"torchvision/{name}", "torchvision", file, TV + file, model, int(size), preset,
                                   "imagenet1k", 1000, int(params), float(top1), float(top5),
                                   file.rsplit("-", 1)[1].split(".")[0], None, _TV_DOC, aliases))
    return out


def _paper_i21k(arch: str, representation_size: int) -> KnownCheckpoint:
    """The paper's ImageNet-21k pre-training of ``arch`` (``ViT-B_16``), with its pre-logits layer."""
    return KnownCheckpoint(f"vit_jax/{arch}-i21k", "vit_jax", f"{arch}.npz", JAX + f"imagenet21k/{arch}.npz",
                           arch[len("ViT-"):].replace("_", "/"), 224, "authors", "imagenet21k", 21843,
                           representation_size=representation_size, reference="paper, ImageNet-21k pre-training")


def _paper_ft(arch: str, top1: Optional[float] = None) -> KnownCheckpoint:
    """The paper's ImageNet fine-tuning of ``arch`` at 384 px; ``top1``: its accuracy in the paper's Table 5."""
    where = "paper Table 5" if top1 else "paper"
    return KnownCheckpoint(f"vit_jax/{arch}", "vit_jax", f"{arch}-imagenet2012.npz",
                           JAX + f"imagenet21k+imagenet2012/{arch}.npz", arch[len("ViT-"):].replace("_", "/"), 384,
                           "authors", "imagenet1k", 1000, top1=top1,
                           reference=f"{where} (ImageNet-21k pre-training, fine-tuned at 384)")


def _deit(size, short, params, top1):
    tag = f"deit_{size}_distilled_patch16_224"
    return KnownCheckpoint(f"timm/{tag}.fb_in1k", "timm", f"{tag}.fb_in1k.safetensors",
                           HF + f"timm/{tag}.fb_in1k/resolve/main/model.safetensors", tag, 224, "timm-imagenet",
                           "imagenet1k", 1000, params=params, top1=top1,
                           reference=f"DeiT paper (DeiT-{short}, distilled); timm (save model.safetensors under "
                                     f"this name)")


def _hub(name, model, size, labels, classes, reference):
    """A Hub repository of a descendant: the folder (config.json + model.safetensors) is fetched."""
    repo = name[len("hf/"):] if name.startswith("hf/") else name
    return KnownCheckpoint(name, "hf" if name.startswith("hf/") else "timm", repo.replace("/", "--"),
                           HF + f"{repo}/tree/main", model, size, "", labels, classes,
                           reference=reference + "; files config.json and model.safetensors in one folder")


KNOWN: Dict[str, KnownCheckpoint] = {k.name: k for k in (
    *_torchvision(),
    # The paper's released checkpoints (google-research/vision_transformer): ImageNet-21k pre-training
    # (with the pre-logits layer, 21843 classes) and its ImageNet fine-tuning at 384 px (paper Table 5).
    _paper_i21k("ViT-B_16", 768),
    _paper_ft("ViT-B_16", top1=83.97),
    _paper_ft("ViT-B_32"),
    _paper_i21k("ViT-L_16", 1024),
    _paper_ft("ViT-L_16", top1=85.15),
    KnownCheckpoint("vit_jax/augreg-B_16-i21k-ft-in1k-224", "vit_jax",
                    "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.01-"
                    "res_224.npz", JAX + "augreg/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0--"
                    "imagenet2012-steps_20k-lr_0.01-res_224.npz", "B/16", 224, "authors", "imagenet1k", 1000,
                    reference="How to train your ViT (AugReg)"),
    KnownCheckpoint("hf/google/vit-base-patch16-224", "hf", "google--vit-base-patch16-224",
                    HF + "google/vit-base-patch16-224/tree/main", "B/16", 224, "hf", "imagenet1k", 1000,
                    reference="files config.json and model.safetensors in one folder"),
    KnownCheckpoint("hf/google/vit-base-patch16-224-in21k", "hf", "google--vit-base-patch16-224-in21k",
                    HF + "google/vit-base-patch16-224-in21k/tree/main", "B/16", 224, "hf", "imagenet21k", 0,
                    representation_size=768, reference="files config.json and model.safetensors; no classifier"),
    KnownCheckpoint("timm/vit_base_patch16_224.augreg2_in21k_ft_in1k", "timm",
                    "vit_base_patch16_224.augreg2_in21k_ft_in1k.safetensors",
                    HF + "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k/resolve/main/model.safetensors",
                    "B/16", 224, "timm", "imagenet1k", 1000, reference="timm (save model.safetensors under this name)"),
    # DeiT's distilled models (Touvron et al. 2021): a distillation token and a second head, ImageNet-1k only
    _deit("tiny", "Ti", 5910800, 74.5),
    _deit("base", "B", 87338192, 83.4),
    # the descendants (vitkit.families): timm's Hub folders and the publishers' own Hugging Face towers; the
    # preprocessing is what each folder's config describes
    *(_hub(f"timm/{repo}", model or repo.split(".")[0], size, labels, classes, ref)
      for repo, model, size, labels, classes, ref in (
        ("deit3_small_patch16_224.fb_in1k", None, 224, "imagenet1k", 1000, "DeiT III (Touvron et al. 2022)"),
        ("deit3_base_patch16_224.fb_in1k", None, 224, "imagenet1k", 1000, "DeiT III (Touvron et al. 2022)"),
        ("vit_small_patch14_dinov2.lvd142m", None, 518, "none", 0, "DINOv2 (Oquab et al. 2023)"),
        ("vit_base_patch14_dinov2.lvd142m", None, 518, "none", 0, "DINOv2 (Oquab et al. 2023)"),
        ("vit_small_patch14_reg4_dinov2.lvd142m", None, 518, "none", 0, "DINOv2 with registers (Darcet et al. 2024)"),
        # OpenAI's weights were trained with QuickGELU: timm's quickgelu model reads this repository
        ("vit_base_patch16_clip_224.openai", "vit_base_patch16_clip_quickgelu_224", 224, "none", 512,
         "OpenAI CLIP image tower, its projection as the head"),
        ("vit_base_patch16_siglip_224.webli", None, 224, "none", 0, "SigLIP image tower (Zhai et al. 2023)"))),
    *(_hub(f"hf/{repo}", repo, size, "none", classes, ref) for repo, size, classes, ref in (
        ("facebook/dinov2-small", 518, 0, "DINOv2 (Dinov2Model)"),
        ("facebook/dinov2-base", 518, 0, "DINOv2 (Dinov2Model)"),
        ("facebook/dinov2-with-registers-small", 518, 0, "DINOv2 with registers (Dinov2WithRegistersModel)"),
        ("openai/clip-vit-base-patch16", 224, 512, "CLIPModel: the image tower and its projection"),
        ("google/siglip-base-patch16-224", 224, 0, "SiglipModel: the image tower"))),
)}


def list_known() -> List[KnownCheckpoint]:
    """Every known checkpoint, in the order ``vitkit weights`` lists them."""
    return list(KNOWN.values())


def get_known(name: str) -> Optional[KnownCheckpoint]:
    """The entry for a name, an alias, or a name without its source prefix (``google/vit-base-patch16-224``,
    ``vit_base_patch16_224.augreg2_in21k_ft_in1k``, ``hf-hub:timm/...``); None if unknown."""
    name = name[len("hf-hub:"):] if name.startswith("hf-hub:") else name
    if name in KNOWN:
        return KNOWN[name]
    low = {k.lower(): v for k, v in KNOWN.items()}
    low.update({a.lower(): v for v in KNOWN.values() for a in v.aliases})
    for prefix in ("", "hf/", "timm/", "torchvision/", "vit_jax/"):  # "google/vit-base-patch16-224" works too
        if (prefix + name).lower() in low:
            return low[(prefix + name).lower()]
    return None
