"""Optimisers, learning-rate schedules and weight averaging, as the paper trains.

- Adam/AdamW with beta1 0.9, beta2 0.999 (Table 3), SGD with momentum 0.9 (fine-tuning).
- No weight decay on what ``model.no_weight_decay()`` names (norms, biases, class token, position
  embeddings).
- Optional layer-wise lr decay (``optim.layer_decay``): lower blocks get geometrically smaller lrs.
- Linear warm-up from 0, then linear or cosine decay; the lr is a pure function of the step, so a
  resumed run continues exactly.
- EMA / Polyak averaging of the weights (the paper's 0.9999 for its best numbers).
"""
from __future__ import annotations

import math
import re
from typing import Dict, List, Optional

import torch
from torch import nn

from ..errors import ConfigError
from .sections import OptimConfig, ScheduleConfig


def param_groups(model: nn.Module, weight_decay: float, layer_decay: Optional[float] = None) -> List[Dict]:
    """Decayed weights and the parameters named by ``no_weight_decay()`` (plus every parameter of < 2 dims),
    each in one group; with ``layer_decay``, those two per layer of :func:`layer_id`, each group's
    ``lr_scale`` = layer_decay ** (L + 1 - layer) (:func:`set_lr` multiplies it in)."""
    skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    named = [(n.replace("_orig_mod.", "").replace("module.", ""), p) for n, p in model.named_parameters()
             if p.requires_grad]
    depth = 1 + max([block_index(n) for n, _ in named if block_index(n) is not None], default=-1)
    groups: Dict[tuple, Dict] = {}
    for clean, p in named:
        decayed = not (clean in skip or p.ndim <= 1)
        layer = layer_id(clean, depth) if layer_decay is not None else 0
        key = (layer, decayed)
        if key not in groups:
            scale = 1.0 if layer_decay is None else layer_decay ** (depth + 1 - layer)
            name = ("decay" if decayed else "no_decay") + (f"_layer{layer}" if layer_decay is not None else "")
            groups[key] = {"params": [], "weight_decay": weight_decay if decayed else 0.0, "name": name,
                           "lr_scale": scale}
        groups[key]["params"].append(p)
    return [groups[k] for k in sorted(groups, key=lambda k: (k[0], not k[1]))]


_BLOCK = re.compile(r"blocks\.(\d+)\.")
_EMBEDDING = ("patch_embed.", "cls_token", "dist_token", "reg_token", "pos_embed", "norm_pre.", "rel_pos.",
              "mask_token")


def _inner(name: str) -> str:
    return name.split("vit.", 1)[1] if name.startswith("vit.") else name  # MPP wraps the ViT


def block_index(name: str) -> Optional[int]:
    """The encoder block a parameter belongs to (``blocks.{i}.``), else None (a hybrid's ResNet blocks are
    the embedding's)."""
    inner = _inner(name)
    m = _BLOCK.match(inner)
    return int(m.group(1)) if m and not inner.startswith(_EMBEDDING) else None


def layer_id(name: str, depth: int) -> int:
    """A parameter's layer for layer-wise lr decay: 0 the embeddings (patches or a hybrid's ResNet, tokens,
    positions, CLIP's norm before the blocks, MPP's mask token), i + 1 block i, depth + 1 everything after
    the blocks (final norm, pooling, head)."""
    i = block_index(name)
    if i is not None:
        return i + 1
    return 0 if _inner(name).startswith(_EMBEDDING) else depth + 1


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    """The recipe's optimiser over :func:`param_groups` (weight decay by name, layer-wise lr decay), with
    fused kernels where this torch has them."""
    groups = param_groups(model, cfg.weight_decay, cfg.layer_decay)
    def make(impl: str) -> torch.optim.Optimizer:
        kw = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
        if cfg.name == "sgd":
            return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov, **kw)
        # "adam" adds the decay to the gradient (L2, coupled); "adamw" decays the weights directly (decoupled),
        # which is what the paper's Flax optimiser does.
        klass = torch.optim.AdamW if cfg.name == "adamw" else torch.optim.Adam
        return klass(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, **kw)

    if cfg.implementation != "auto":
        return make(cfg.implementation)
    # "auto": the fused kernels (one pass over parameters, gradients and moments; on the CPU since torch 2.4),
    # else foreach.
    try:
        return make("fused")
    except (RuntimeError, ValueError):  # this torch or device has no fused kernel
        return make("foreach")


class Schedule:
    """lr(step) = peak * warm-up ramp, then cosine/linear decay to ``min_lr`` at ``total`` steps."""

    def __init__(self, peak: float, total: int, warmup: int, decay: str = "cosine", min_lr: float = 0.0):
        if total <= 0:
            raise ConfigError(f"the run has {total} steps: train for at least one step")
        if warmup >= total and total > 1:
            raise ConfigError(f"warm-up ({warmup} steps) is not shorter than the run ({total} steps): shorten it")
        self.peak, self.total, self.warmup, self.decay, self.min_lr = peak, total, warmup, decay, min_lr

    def __call__(self, step: int) -> float:
        """The lr for optimiser step ``step`` (0-based)."""
        if step < self.warmup:
            return self.peak * (step + 1) / self.warmup
        if self.decay == "constant":
            return self.peak
        span = max(self.total - self.warmup, 1)
        t = min(max(step - self.warmup, 0) / span, 1.0)
        frac = 0.5 * (1 + math.cos(math.pi * t)) if self.decay == "cosine" else 1.0 - t
        return self.min_lr + (self.peak - self.min_lr) * frac

    @classmethod
    def from_config(cls, cfg: ScheduleConfig, peak: float, steps_per_epoch: int) -> "Schedule":
        total = cfg.steps if cfg.steps is not None else int(round(cfg.epochs * steps_per_epoch))
        warm = cfg.warmup_steps if cfg.warmup_steps is not None else int(round(cfg.warmup_epochs * steps_per_epoch))
        if warm >= total > 1:
            given = (f"schedule.warmup_steps={cfg.warmup_steps}" if cfg.warmup_steps is not None
                     else f"schedule.warmup_epochs={cfg.warmup_epochs:g} ({warm} steps)")
            raise ConfigError(f"the warm-up, {given}, is not shorter than the run ({total} steps): shorten it, e.g. "
                              f"--set schedule.warmup_steps={max(1, total // 10)}")
        return cls(peak, total, warm, cfg.decay, cfg.min_lr)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The schedule's lr into every group, times the group's ``lr_scale`` (layer-wise decay)."""
    for g in optimizer.param_groups:
        value = lr * g.get("lr_scale", 1.0)
        if isinstance(g["lr"], torch.Tensor):
            g["lr"].fill_(value)
        else:
            g["lr"] = value


class EMA:
    """Exponential moving average of parameters and buffers (Polyak averaging).

    ``decay`` 0.9999 is the paper's; with ``warmup`` the effective decay is min(decay, (1+t)/(10+t))
    so that short runs are not dominated by the random initialisation."""

    def __init__(self, model: nn.Module, decay: float, warmup: bool = True):
        self.decay, self.warmup, self.updates = decay, warmup, 0
        self.shadow = {k: v.detach().clone().float() for k, v in _state(model).items()}

    def rate(self) -> float:
        """This update's decay: ``decay``, or less early on with ``warmup``."""
        t = self.updates
        return min(self.decay, (1 + t) / (10 + t)) if self.warmup else self.decay

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the average one step towards the model's current weights."""
        d = self.rate()
        src = _state(model)
        keys = [k for k in self.shadow if src[k].is_floating_point()]
        torch._foreach_lerp_([self.shadow[k] for k in keys], [src[k].detach().float() for k in keys], 1.0 - d)
        for k in self.shadow:
            if not src[k].is_floating_point():
                self.shadow[k].copy_(src[k])
        self.updates += 1

    def state_dict(self) -> Dict:
        """The average and its step count, for a checkpoint."""
        return {"decay": self.decay, "updates": self.updates, "shadow": self.shadow}

    def load_state_dict(self, d: Dict) -> None:
        """Restore what :meth:`state_dict` gave (an exact resume)."""
        self.updates = int(d["updates"])
        for k, v in d["shadow"].items():
            self.shadow[k].copy_(v)

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        """Write the averaged weights into ``model`` (in its dtypes)."""
        for k, v in _state(model).items():
            v.copy_(self.shadow[k].to(v.dtype))


def _state(model: nn.Module) -> Dict[str, torch.Tensor]:
    """Parameters and persistent buffers by clean name (unwrapping DDP / torch.compile)."""
    inner = unwrap(model)
    return {k: v for k, v in inner.state_dict(keep_vars=True).items()}


def unwrap(model: nn.Module) -> nn.Module:
    while True:
        if hasattr(model, "module") and isinstance(model.module, nn.Module):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model

