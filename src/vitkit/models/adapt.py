"""Fit a vitkit state dict from one configuration to another: the one place where weights are adapted.

Used when loading weights into a model built at another resolution (the
position tables are resized on the 2D grid, Section 3.2) or for another
number of classes (the head is replaced by a zero-initialised one, as the
paper does for fine-tuning).
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..config import ViTConfig
from ..errors import CheckpointError, ConfigError
from .posemb import infer_square_grid, resize_axis, resize_pos_embed, resize_relative_table


def adapt_state_dict(state: Dict[str, torch.Tensor], config: ViTConfig, *,
                     source_grid: Optional[Sequence[int]] = None, method: Optional[str] = None,
                     head: str = "auto") -> Tuple[Dict[str, torch.Tensor], List[str]]:
    """Return (adapted copy of ``state``, list of human-readable changes).

    - ``pos_embed`` / ``pos_embed_row|col`` / relative tables are resized to
      ``config.grid_size`` with ``method`` (default: ``config.posemb_resize``).
      A non-square source grid must be given as ``source_grid``.
    - ``head``: "auto" re-initialises the head to zeros when the class count
      differs (and drops it for ``num_classes=0``), "keep" leaves it alone
      (a mismatch is then reported by ``load_state_dict``), "reset" always
      re-initialises it.
    - pre-logits weights are dropped when ``config.representation_size`` is
      None (the fine-tuning head sits directly on the class token).
    """
    if head not in ("auto", "keep", "reset"):
        raise ConfigError(f"head={head!r}: use 'auto', 'keep' or 'reset'")
    method = method or config.posemb_resize
    out = dict(state)
    notes: List[str] = []
    if out.get("pos_embed") is not None:
        out = _adapt_pos_embed(out, config, source_grid, method, notes)
    _adapt_grid_tables(out, config.grid_size, method, notes)
    if config.representation_size is None and any(k.startswith("pre_logits.") for k in out):
        for k in [k for k in out if k.startswith("pre_logits.")]:
            del out[k]
        notes.append("pre-logits layer dropped (model has none)")
        if "head.weight" in out and out["head.weight"].shape[1] != config.width and head == "auto":
            head = "reset"
    if head != "keep":
        _adapt_heads(out, config, head == "reset", notes)
    return out, notes


def _adapt_pos_embed(out: Dict[str, torch.Tensor], config: ViTConfig, source_grid: Optional[Sequence[int]],
                     method: str, notes: List[str]) -> Dict[str, torch.Tensor]:
    """The learned 1D table: its class-token slots folded or added as the model has them, then resized."""
    aa, new_grid = config.posemb_antialias, config.grid_size
    prefix = config.num_posemb_prefix  # slots of the table before the patches (registers have none)
    pe = out["pos_embed"]
    if pe.ndim == 2:
        pe = pe.unsqueeze(0)
    # slots for the class / distillation token: fold them into the tokens, or add zero ones
    tokens = int(config.class_token) + int(config.distill_token)
    have = (pe.shape[1] - source_grid[0] * source_grid[1] if source_grid is not None
            else tokens if tokens and _square(pe.shape[1] - tokens) and not _square(pe.shape[1]) else 0)
    if tokens and have == tokens and prefix == 0:
        out = fold_class_slots(out, tokens)
        pe = out["pos_embed"]
        notes.append("the position table's class-token slot folded into the class token (the model gives "
                     "it no position: posemb_class_slot=False)")
    elif tokens and have == 0 and prefix == tokens:
        pe = out["pos_embed"] = torch.cat([pe.new_zeros(pe.shape[0], tokens, pe.shape[-1]), pe], dim=1)
        notes.append("zero class-token slot(s) added to the position table (posemb_class_slot=True)")
    if pe.shape[1] != config.posemb_len:
        old = tuple(source_grid) if source_grid is not None else infer_square_grid(pe.shape[1], prefix)
        out["pos_embed"] = resize_pos_embed(pe, old, new_grid, prefix, method, aa)
        notes.append(f"pos_embed resized {old[0]}x{old[1]} -> {new_grid[0]}x{new_grid[1]} "
                     f"({method}{', antialiased' if aa and method == 'bicubic' else ''})")
    return out


def _adapt_grid_tables(out: Dict[str, torch.Tensor], new_grid: Tuple[int, int], method: str,
                       notes: List[str]) -> None:
    """The learned 2D halves and the relative-position tables, resized in place to ``new_grid``."""
    for key, axis in (("pos_embed_row", 0), ("pos_embed_col", 1)):
        t = out.get(key)
        if t is not None and t.shape[1] != new_grid[axis]:
            out[key] = resize_axis(t, new_grid[axis], axis, method)
            notes.append(f"{key} resized {t.shape[1]} -> {new_grid[axis]}")
    want = (2 * new_grid[0] - 1, 2 * new_grid[1] - 1)
    for key in [k for k in out if re.fullmatch(r"rel_pos\.\d+\.table", k)]:
        t = out[key]
        if tuple(t.shape[-2:]) != want:
            out[key] = resize_relative_table(t, new_grid, method)
            notes.append(f"{key} resized {tuple(t.shape[-2:])} -> {want}")


def _adapt_heads(out: Dict[str, torch.Tensor], config: ViTConfig, reset: bool, notes: List[str]) -> None:
    """The class head, and DeiT's distillation head when the model has a distillation token, in place:
    dropped where the model has none, zero-initialised where the class count (or ``reset``) says so."""
    heads = [("head", config.representation_size or config.width, True),
             ("head_dist", config.width, config.distill_token and config.distill_head)]
    for name, in_features, wanted in heads:
        w = out.get(f"{name}.weight")
        if w is not None and (config.num_classes == 0 or not wanted):
            del out[f"{name}.weight"]
            out.pop(f"{name}.bias", None)
            notes.append(f"{name} dropped ({'num_classes=0' if wanted else 'the model has no distillation head'})")
        elif w is not None and (reset or tuple(w.shape) != (config.num_classes, in_features)):
            out[f"{name}.weight"] = w.new_zeros(config.num_classes, in_features)
            out[f"{name}.bias"] = w.new_zeros(config.num_classes)
            notes.append(f"{name} re-initialised to zeros: {w.shape[0]} -> {config.num_classes} classes")
        elif w is None and wanted and config.num_classes > 0:
            ref = out.get("norm.weight", next(iter(out.values()), torch.zeros(1)))
            out[f"{name}.weight"] = ref.new_zeros(config.num_classes, in_features)
            out[f"{name}.bias"] = ref.new_zeros(config.num_classes)
            notes.append(f"{name} re-initialised to zeros: none -> {config.num_classes} classes")


def _square(n: int) -> bool:
    side = int(round(max(n, 0) ** 0.5))
    return n > 0 and side * side == n


def fold_class_slots(state: Dict[str, torch.Tensor], n: int) -> Dict[str, torch.Tensor]:
    """A state whose position table's first ``n`` slots (class, distillation token) are added to those
    tokens and dropped from the table: the same function for a model without them (posemb_class_slot=False)."""
    out = dict(state)
    pe = out["pos_embed"]
    keys = [k for k in ("cls_token", "dist_token") if k in out][:n]
    for j, key in enumerate(keys):
        slot = pe[:, j:j + 1]
        if bool(slot.any()):
            out[key] = out[key] + slot
    out["pos_embed"] = pe[:, n:].contiguous()
    return out


def compare_state_dict(state: Dict[str, torch.Tensor], expected: Dict[str, torch.Tensor]) -> Dict[str, List[str]]:
    """Keys ``state`` lacks, keys it has extra, and shape mismatches ("key: [got] vs [want]") against
    ``expected`` (e.g. ``model.state_dict()``)."""
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    mismatched = [f"{k}: {list(state[k].shape)} vs model {list(expected[k].shape)}"
                  for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape)]
    return {"missing": missing, "unexpected": unexpected, "mismatched": mismatched}


def check_state_dict(state: Dict[str, torch.Tensor], expected: Dict[str, torch.Tensor], source: str = "weights",
                     strict: bool = True) -> Dict[str, List[str]]:
    """Strict loading: raise a ValueError listing every missing / unexpected / mis-shaped key by name.
    With ``strict=False`` only shape mismatches raise (they can never load); the report is returned."""
    report = compare_state_dict(state, expected)
    bad = report["mismatched"] or (strict and (report["missing"] or report["unexpected"]))
    if bad:
        parts = [f"{name} ({len(keys)}): {', '.join(keys[:12])}{' ...' if len(keys) > 12 else ''}"
                 for name, keys in report.items() if keys and (strict or name == "mismatched")]
        raise CheckpointError(f"{source} does not fit the model: " + "; ".join(parts) +
                              ". Build the model with the checkpoint's config, or pass strict=False to load what fits")
    return report
