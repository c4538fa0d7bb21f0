"""Which layout a set of tensors is in, decided from the key names (never the file name)."""
from __future__ import annotations

from typing import Any, Dict, List

from .keymap import Mapped, signature_hits

SHOW = 12


def _candidates(keys: List[str]) -> Dict[str, int]:
    from .formats import hf, npz, timm, torchvision

    scores = {
        torchvision.NAME: signature_hits(keys, torchvision.RULES),
        timm.NAME: signature_hits(keys, timm.RULES),
        hf.NAME: signature_hits(list(hf.strip_prefix(dict.fromkeys(keys))), hf.RULES),
    }
    prefix = npz.find_prefix(keys)
    stripped = [k[len(prefix):] for k in keys if k.startswith(prefix)]
    scores[npz.NAME] = max(signature_hits(stripped, npz.rules({"flavour": f})) for f in npz.FLAVOURS)
    return scores


def detect_layout(tensors: Dict[str, Any], source: str = "weights") -> str:
    """The format whose key map recognises most keys; an error listing the keys if none does."""
    keys = list(tensors)
    scores = _candidates(keys)
    best = max(scores, key=scores.get)
    if scores[best] == 0:
        raise ValueError(
            f"{source}: no known ViT layout recognised ({len(keys)} tensors, none matched the authors' .npz, "
            f"torchvision, timm or Hugging Face key names). First keys: {_show(keys)}. Expected e.g. "
            f"'embedding/kernel' (npz), 'conv_proj.weight' (torchvision), 'patch_embed.proj.weight' (timm) or "
            f"'vit.embeddings.patch_embeddings.projection.weight' (Hugging Face)")
    return best


def layout_error(source: str, fmt: str, mapped: Mapped) -> ValueError:
    parts = [f"{source}: recognised as the {fmt} layout ({len(mapped.state)} tensors mapped)"]
    if mapped.unused:
        parts.append(f"but {len(mapped.unused)} key(s) are not part of the paper's ViT in that layout: "
                     f"{_show(mapped.unused)}")
    if mapped.missing:
        parts.append(f"{'and' if mapped.unused else 'but'} {len(mapped.missing)} expected key(s) are missing: "
                     f"{_show(mapped.missing)}")
    parts.append("(a different architecture, e.g. a hybrid ResNet stem, register tokens, layer scale or MAP "
                 "pooling, or an incomplete file)")
    return ValueError(", ".join(parts[:-1]) + " " + parts[-1])


def _show(keys: List[str]) -> str:
    keys = list(keys)
    more = f" ... and {len(keys) - SHOW} more" if len(keys) > SHOW else ""
    return ", ".join(keys[:SHOW]) + more
