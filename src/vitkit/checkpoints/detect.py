"""Which layout a set of tensors is in, decided from the key names (never the file name)."""
from __future__ import annotations

from typing import Any, Dict, List

from ..errors import CheckpointError
from .keymap import show_keys, signature_hits


def _candidates(keys: List[str]) -> Dict[str, int]:
    from .formats import hf, hf_towers, npz, open_clip, timm, torchvision

    scores = {
        torchvision.NAME: signature_hits(keys, torchvision.RULES),
        timm.NAME: signature_hits(keys, timm.RULES),
        hf.NAME: signature_hits(list(hf.strip_prefix(dict.fromkeys(keys))), hf.RULES),
        hf_towers.NAME: hf_towers.signature_hits(keys),  # DINOv2, CLIP, SigLIP image towers
        open_clip.NAME: open_clip.signature_hits(keys),
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
        raise CheckpointError(
            f"{source}: no known ViT layout recognised ({len(keys)} tensors, none matched the authors' .npz, "
            f"torchvision, timm or Hugging Face key names). First keys: {show_keys(keys)}. Expected e.g. "
            f"'embedding/kernel' (npz), 'conv_proj.weight' (torchvision), 'patch_embed.proj.weight' (timm) or "
            f"'vit.embeddings.patch_embeddings.projection.weight' (Hugging Face)")
    return best
