"""``vitkit smoke``: the paper's mechanics on a tiny ViT, on CPU, in a few seconds."""
from __future__ import annotations

import time
from typing import Callable, Dict

import torch
import torch.nn.functional as F

from .config import ViTConfig
from .models import VisionTransformer, adapt_state_dict

SMOKE_CONFIG = ViTConfig(img_size=32, patch_size=4, in_chans=3, num_classes=10, width=64, depth=2,
                         num_heads=4, mlp_dim=128, name="smoke")


def _max_change(before: Dict[str, torch.Tensor], model: torch.nn.Module, head: bool) -> float:
    diffs = [(p.detach() - before[n]).abs().max().item() for n, p in model.named_parameters()
             if n.startswith(("head.", "pre_logits.")) == head]
    return max(diffs) if diffs else 0.0


def run_smoke(echo: Callable[[str], None] = print, seed: int = 0) -> Dict[str, object]:
    """Run the mechanics check; return the facts it printed. Raises RuntimeError if one fails."""
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    cfg = SMOKE_CONFIG
    model = VisionTransformer(cfg)
    x = torch.rand(2, cfg.in_chans, *cfg.img_size)
    y = torch.tensor([3, 7])
    facts: Dict[str, object] = {}

    def show(label: str, t: torch.Tensor, note: str) -> None:
        facts[label] = list(t.shape)
        echo(f"{label:<18}{str(list(t.shape)):<16}{note}")

    echo(f"vitkit smoke: {cfg.img_size[0]}x{cfg.img_size[1]} images, {cfg.patch_size[0]}x{cfg.patch_size[1]} "
         f"patches, width {cfg.width}, {cfg.depth} blocks, {cfg.num_heads} heads, {cfg.num_classes} classes, "
         f"batch {x.shape[0]}")
    with torch.no_grad():
        grid = model.patch_embed(x)
        patches = grid.flatten(2).transpose(1, 2)
        show("patch embeddings", patches, f"Eq. 1: {patches.shape[1]} patches of "
             f"{cfg.in_chans}x{cfg.patch_size[0]}x{cfg.patch_size[1]} -> width {cfg.width}")
        tokens, _ = model.embed(x)
        tokens = tokens + model.position_embedding()
        show("tokens", tokens, "class token prepended, position embeddings added")
        logits = model(x)
        show("logits", logits, "final LayerNorm on token 0, then the zero-initialised head")

    _two_updates(model, x, y, facts, echo)
    _resized_grid(model, show, facts, echo)
    facts["seconds"] = time.perf_counter() - t0
    echo(f"smoke ok in {facts['seconds']:.2f} s")
    return facts


def _two_updates(model: VisionTransformer, x: torch.Tensor, y: torch.Tensor, facts: Dict[str, object],
                 echo: Callable[[str], None]) -> None:
    """Two SGD steps: the first changes only the zero-initialised head, the second the backbone too."""
    opt = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9)
    model.train()
    for step in (1, 2):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
        head, backbone = _max_change(before, model, True), _max_change(before, model, False)
        facts[f"update{step}"] = {"loss": loss.item(), "grad_norm": gnorm.item(), "head_change": head,
                                  "backbone_change": backbone}
        echo(f"update {step}: loss {loss.item():.4f}, gradient norm {gnorm.item():.3g} (clipped at 1); "
             f"head max |change| {head:.3g}, backbone max |change| {backbone:.3g}")
        if step == 1 and not (head > 0 and backbone == 0):
            raise RuntimeError("update 1 should change only the zero-initialised head")
        if step == 2 and not backbone > 0:
            raise RuntimeError("update 2 should change the backbone")
    echo("  the zero head blocks gradients to the backbone on update 1; they reach it on update 2")


def _resized_grid(model: VisionTransformer, show: Callable[[str, torch.Tensor, str], None],
                  facts: Dict[str, object], echo: Callable[[str], None]) -> None:
    """The weights at 48 px: the position grid resized (class slot kept), the model run at the new size."""
    model.eval()
    cfg = model.config
    big_cfg = cfg.replace(img_size=48)
    state, notes = adapt_state_dict(model.state_dict(), big_cfg)
    big = VisionTransformer(big_cfg)
    big.load_state_dict(state)
    old_pe, new_pe = model.pos_embed, big.pos_embed
    facts["pos_embed"] = [list(old_pe.shape), list(new_pe.shape)]
    echo(f"position grid {cfg.grid_size[0]}x{cfg.grid_size[1]} -> {big_cfg.grid_size[0]}x{big_cfg.grid_size[1]}: "
         f"pos_embed {list(old_pe.shape)} -> {list(new_pe.shape)} (bilinear, aligned corners; class slot kept)")
    if not torch.equal(old_pe[:, 0], new_pe[:, 0]):
        raise RuntimeError("the class-token slot changed in the resize")
    with torch.no_grad():
        big_logits = big(torch.rand(2, cfg.in_chans, 48, 48))
    show("logits at 48 px", big_logits, "the same weights, run at 48x48 with the resized grid")
