"""The Vision Transformer (Eq. 1-4), driven entirely by a ViTConfig."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..config import ViTConfig
from .intermediates import TimmInterface
from .kernel_plan import Backend, KernelPlan, bind, resolve, widest_row
from .layers import (
    AttentionPool,
    AxialBlock,
    Block,
    PatchDropout,
    PatchEmbed,
    fast_inference,
    lecun_normal_,
)
from .meta import ModelMeta
from .posemb import (
    RelativePositionBias,
    learn2d_table,
    resize_axis,
    resize_pos_embed,
    resize_relative_table,
    sincos_table,
)
from .resnet import HybridEmbed

Grid = Tuple[int, int]


@dataclass(frozen=True)
class HeadOutputs:
    """What the head makes of the last block: ``logits`` (what ``forward`` returns), the pooled pre-logits
    ``features`` [B, D], and for a model with a distillation head the pair (class logits, distillation
    logits) as ``heads`` (None otherwise)."""

    logits: Any
    features: torch.Tensor
    heads: Optional[Tuple[torch.Tensor, torch.Tensor]] = None


def patch_embedding(cfg: ViTConfig) -> nn.Module:
    """Eq. 1's embedding of ``cfg``: patches of the image, or (hybrid, Section 3.1) of a ResNet feature map."""
    if cfg.backbone == "resnet":
        return HybridEmbed(cfg.in_chans, cfg.width, cfg.patch_size, cfg.backbone_layers, cfg.backbone_width,
                           std_eps=cfg.std_conv_eps, std_style=cfg.std_conv_style, gn_eps=cfg.gn_eps,
                           pad=cfg.dynamic_img_pad, stem=cfg.backbone_stem, unit=cfg.backbone_unit)
    return PatchEmbed(cfg.patch_size, cfg.in_chans, cfg.width, pad=cfg.dynamic_img_pad, bias=cfg.patch_bias)


class VisionTransformer(TimmInterface, nn.Module):
    """ViT: patch embedding, class token, position embeddings, L pre-norm blocks, final LN, head.

    The descendants are the same class with config fields set: register tokens (``reg_tokens``), a
    LayerNorm before the blocks (``norm_pre``), LayerScale (``layer_scale``), QuickGELU, the final norm
    after pooling or none (``final_norm``) and attention pooling (``pool="map"``).

    >>> model = VisionTransformer(ViTConfig(img_size=32, patch_size=4, width=64, depth=2,
    ...                                     num_heads=4, mlp_dim=128, num_classes=10))
    >>> model(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    """

    meta: ModelMeta  # labels, preprocessing and origin of the weights (filled by the checkpoint loader)

    def __init__(self, config: Optional[ViTConfig] = None, **overrides: Any):
        super().__init__()
        cfg = config if config is not None else ViTConfig()
        if overrides:
            cfg = cfg.replace(**overrides)
        self.config = cfg
        self.meta = ModelMeta()
        d, gh_gw = cfg.width, cfg.grid_size
        self.patch_embed = patch_embedding(cfg)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if cfg.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, d)) if cfg.distill_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, d)) if cfg.reg_tokens else None

        # Position embeddings (Appendix D.4): a table per layer for "every_layer", else one.
        n_tab = cfg.num_posemb_tables
        self.pos_embed = self.pos_embed_row = self.pos_embed_col = None
        self.rel_pos = None
        if cfg.posemb == "learn":
            self.pos_embed = nn.Parameter(torch.zeros(n_tab, cfg.posemb_len, d))
        elif cfg.posemb == "learn2d":
            self.pos_embed_row = nn.Parameter(torch.zeros(n_tab, gh_gw[0], d // 2))
            self.pos_embed_col = nn.Parameter(torch.zeros(n_tab, gh_gw[1], d // 2))
        elif cfg.posemb == "relative":
            n_rel = 1 if cfg.posemb_where == "every_layer_shared" else cfg.depth
            self.rel_pos = nn.ModuleList(
                RelativePositionBias(gh_gw, cfg.num_heads, cfg.class_token) for _ in range(n_rel))
        elif cfg.posemb == "sincos2d":
            self.register_buffer("pos_embed_fixed", sincos_table(gh_gw, d, cfg.num_posemb_prefix), persistent=False)
        self.pos_drop = nn.Dropout(cfg.dropout)
        self.patch_dropout = PatchDropout(cfg.num_prefix_tokens)
        self.norm_pre = nn.LayerNorm(d, eps=cfg.ln_eps) if cfg.norm_pre else None  # CLIP's ln_pre

        rates = [cfg.drop_path * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]  # linear stochastic depth
        block = lambda r: Block(d, cfg.num_heads, cfg.mlp_dim, qkv_bias=cfg.qkv_bias, dropout=cfg.dropout,  # noqa: E731
                                attn_dropout=cfg.attn_dropout, drop_path=r, ln_eps=cfg.ln_eps, gelu=cfg.gelu,
                                layer_scale=cfg.layer_scale)
        self.blocks = nn.ModuleList(
            AxialBlock(block(r), block(r)) if cfg.attention == "axial" else block(r) for r in rates)
        # Eq. 4's LayerNorm on every token, or (final_norm="pooled") on the pooled vector (timm's fc_norm)
        self.norm = nn.LayerNorm(d, eps=cfg.ln_eps) if cfg.final_norm == "tokens" else nn.Identity()
        self.fc_norm = nn.LayerNorm(d, eps=cfg.ln_eps) if cfg.final_norm == "pooled" else None
        self.attn_pool = (AttentionPool(d, cfg.num_heads, cfg.mlp_dim, ln_eps=cfg.ln_eps, gelu=cfg.gelu)
                          if cfg.pool == "map" else None)

        rep = cfg.representation_size
        self.pre_logits = (nn.Sequential(OrderedDict(fc=nn.Linear(d, rep), act=nn.Tanh()))
                           if rep else nn.Identity())
        self.head_drop = nn.Dropout(cfg.head_dropout)  # timm's drop_rate: on the features the head reads
        self.head = nn.Linear(rep or d, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        # DeiT: the distillation token's own head
        self.head_dist = (nn.Linear(d, cfg.num_classes)
                          if cfg.distill_token and cfg.distill_head and cfg.num_classes > 0 else None)
        self.grad_checkpointing = False
        self.reset_parameters()
        self.set_kernel_plan()  # the declared backend and the measurements already known: no timing

    # --- initialisation (the authors' Flax initialisers) ---------------------
    def reset_parameters(self) -> None:
        """Initialise every weight as the authors' Flax code does (zero head, LeCun-normal patch projection,
        Xavier-uniform dense layers), and the descendants' parts as their papers do."""
        d = self.config.width
        if isinstance(self.patch_embed, HybridEmbed):
            self.patch_embed.backbone.reset_parameters()
        lecun_normal_(self.patch_embed.proj.weight)
        if self.patch_embed.proj.bias is not None:
            nn.init.zeros_(self.patch_embed.proj.bias)
        for p in (self.pos_embed, self.pos_embed_row, self.pos_embed_col):
            if p is not None:
                nn.init.normal_(p, std=0.02)
        if self.cls_token is not None:
            nn.init.zeros_(self.cls_token)
        if self.dist_token is not None:  # DeiT's init; it must differ from the class token's
            nn.init.trunc_normal_(self.dist_token, std=0.02, a=-0.04, b=0.04)
        if self.reg_token is not None:  # DINOv2's init of its registers
            nn.init.normal_(self.reg_token, std=1e-6)
        for blk in (b for layer in self.blocks for b in (layer.sublayers() if isinstance(layer, AxialBlock)
                                                         else (layer,))):
            for i in range(3):  # q, k and v each get their own Xavier-uniform [D, D] kernel
                nn.init.xavier_uniform_(blk.attn.qkv.weight[i * d:(i + 1) * d])
            if blk.attn.qkv.bias is not None:
                nn.init.zeros_(blk.attn.qkv.bias)
            nn.init.xavier_uniform_(blk.attn.proj.weight)
            nn.init.zeros_(blk.attn.proj.bias)
            for fc in (blk.mlp.fc1, blk.mlp.fc2):
                nn.init.xavier_uniform_(fc.weight)
                nn.init.normal_(fc.bias, std=1e-6)
            for ls in (blk.ls1, blk.ls2):
                if ls is not None:
                    nn.init.constant_(ls.gamma, ls.init)
        for norm in (self.norm, self.norm_pre, self.fc_norm):
            if isinstance(norm, nn.LayerNorm):
                norm.reset_parameters()
        if self.attn_pool is not None:  # the query as timm / big_vision draw it; dense layers as the blocks'
            pool = self.attn_pool
            nn.init.trunc_normal_(pool.latent, std=d ** -0.5)
            for fc in (pool.q, pool.kv, pool.proj, pool.mlp.fc1, pool.mlp.fc2):
                nn.init.xavier_uniform_(fc.weight)
                nn.init.zeros_(fc.bias)
            pool.norm.reset_parameters()
        if isinstance(self.pre_logits, nn.Sequential):
            lecun_normal_(self.pre_logits.fc.weight)
            nn.init.zeros_(self.pre_logits.fc.bias)
        for head in (self.head, self.head_dist):
            if isinstance(head, nn.Linear):  # the paper's zero-initialised head
                nn.init.zeros_(head.weight)
                nn.init.zeros_(head.bias)

    def set_kernel_plan(self, plan: Union[None, str, Backend, KernelPlan] = None) -> KernelPlan:
        """Bind a kernel plan to the modules (:mod:`vitkit.models.kernel_plan`): ``plan`` itself, or one
        resolved now for this model's config from a backend (a spec such as ``"gemm=aten"``; None: the backend
        in force) and the measurements already known. The forward reads it and decides nothing; the last
        block computes ``plan.head_tokens`` tokens (None: every one). Returns the plan bound."""
        if not isinstance(plan, KernelPlan):
            plan = resolve(self.config, backend=plan)
        if plan.head_tokens is not None and (type(self.blocks[-1]) is not Block or plan.head_tokens
                                             != self.config.head_tokens):
            plan = plan.replace(head_tokens=None)  # a swapped last block, or a plan made for another config
        self.kernel_plan = plan
        bind(self, plan)
        return plan

    def set_grad_checkpointing(self, enable: bool = True) -> "VisionTransformer":
        """Recompute block activations in backward instead of storing them (saves memory)."""
        self.grad_checkpointing = enable
        return self

    # --- position embeddings (the tables' kinds and resizing: posemb.py) ---------------
    def position_embedding(self, grid: Optional[Grid] = None) -> Optional[torch.Tensor]:
        """The additive table [n_tables, tokens, D] for a patch grid, one slot per token of the sequence
        (class slot first; tokens without a position, registers and with ``posemb_class_slot=False`` the
        class token, get zero slots), or None."""
        pe = self._position_table(grid)
        cfg = self.config
        p, missing = cfg.num_posemb_prefix, cfg.num_prefix_tokens - cfg.num_posemb_prefix
        if pe is None or not missing:
            return pe
        return torch.cat([pe[:, :p], pe.new_zeros(pe.shape[0], missing, pe.shape[-1]), pe[:, p:]], 1)

    def _position_table(self, grid: Optional[Grid] = None) -> Optional[torch.Tensor]:
        cfg = self.config
        built = cfg.grid_size
        grid = tuple(grid) if grid is not None else built
        if cfg.posemb == "learn":
            if grid == built:
                return self.pos_embed
            return resize_pos_embed(self.pos_embed, built, grid, cfg.num_posemb_prefix, cfg.posemb_resize,
                                    cfg.posemb_antialias)
        if cfg.posemb == "learn2d":
            return learn2d_table(self.pos_embed_row, self.pos_embed_col, grid, cfg.num_posemb_prefix,
                                 cfg.posemb_resize)
        if cfg.posemb == "sincos2d":
            fixed = self.pos_embed_fixed
            return fixed if grid == built else sincos_table(grid, cfg.width, cfg.num_posemb_prefix, fixed.device,
                                                            fixed.dtype)
        return None

    def set_img_size(self, img_size: Union[int, Tuple[int, int]]) -> "VisionTransformer":
        """Rebuild for a new input resolution, resizing every learned position table on the 2D grid."""
        old, cfg = self.config.grid_size, self.config.replace(img_size=img_size)
        new = cfg.grid_size
        with torch.no_grad():
            if self.pos_embed is not None:
                self.pos_embed = nn.Parameter(resize_pos_embed(self.pos_embed, old, new, cfg.num_posemb_prefix,
                                                               cfg.posemb_resize, cfg.posemb_antialias))
            if self.pos_embed_row is not None:
                self.pos_embed_row = nn.Parameter(resize_axis(self.pos_embed_row, new[0], 0, cfg.posemb_resize))
                self.pos_embed_col = nn.Parameter(resize_axis(self.pos_embed_col, new[1], 1, cfg.posemb_resize))
            for rel in self.rel_pos or []:
                rel.table = nn.Parameter(resize_relative_table(rel.table, new, cfg.posemb_resize))
                rel.grid = new
        self.config = cfg
        if cfg.posemb == "sincos2d":
            fixed = self.pos_embed_fixed
            self.pos_embed_fixed = sincos_table(new, cfg.width, cfg.num_posemb_prefix, fixed.device, fixed.dtype)
        return self

    # --- forward pieces ----------------------------------------------------------
    def embed(self, x: torch.Tensor) -> Tuple[torch.Tensor, Grid]:
        """Eq. 1 without positions: [B, C, H, W] -> tokens [B, prefix + N, D] and the patch grid."""
        self.config.check_images(x.shape)
        x = self.patch_embed(x)
        grid = (x.shape[-2], x.shape[-1])
        return self.add_prefix_tokens(x.flatten(2).transpose(1, 2)), grid

    def add_prefix_tokens(self, patches: torch.Tensor) -> torch.Tensor:
        """[B, N, D] patch tokens -> [B, prefix + N, D]: the class token, then DeiT's distillation token or
        the register tokens."""
        prefix = [t.expand(patches.shape[0], -1, -1).to(patches.dtype)
                  for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        return torch.cat(prefix + [patches], dim=1) if prefix else patches

    def _run_blocks(self, x: torch.Tensor, grid: Grid, keep: Sequence[int] = (), need_weights: bool = False,
                    stop_after: Optional[int] = None, patch_drop: float = 0.0,
                    head_tokens: Optional[int] = None
                    ) -> Tuple[torch.Tensor, Dict[int, torch.Tensor], Dict[int, torch.Tensor]]:
        cfg = self.config
        pe = self.position_embedding(grid)
        if pe is not None:
            pe = pe.to(x.dtype)
        every = cfg.posemb_where != "input"
        if pe is not None and not every:
            x = x + pe
        x = self.pos_drop(x)
        if patch_drop and self.training:
            x = self.patch_dropout(x, patch_drop)
        if self.norm_pre is not None:
            x = self.norm_pre(x)
        biases = None
        if self.rel_pos is not None:
            biases = [rel(grid, cfg.posemb_resize) for rel in self.rel_pos]
        saved, maps = {}, {}
        keep = set(keep)
        ckpt = self.grad_checkpointing and self.training and torch.is_grad_enabled() and not need_weights
        axial = {"grid": grid} if cfg.attention == "axial" else {}  # axial blocks attend along the grid
        for i, blk in enumerate(self.blocks):
            if pe is not None and every:
                x = x + pe[i if pe.shape[0] > 1 else 0]
            bias = None if biases is None else biases[i if len(biases) > 1 else 0]
            last = {"head_tokens": head_tokens} if head_tokens is not None and i == len(self.blocks) - 1 else {}
            x, w = (checkpoint(blk, x, bias, use_reentrant=False, **axial, **last) if ckpt
                    else blk(x, bias, need_weights and i in keep, **axial, **last))
            if i in keep:
                saved[i] = x
                if w is not None:
                    maps[i] = w
            if stop_after is not None and i >= stop_after:
                break
        return x, saved, maps

    def forward_features(self, x: torch.Tensor, patch_drop: Optional[float] = None) -> torch.Tensor:
        """All tokens after the final LayerNorm (``final_norm="tokens"``; else as the last block left them):
        [B, prefix + N, D] (in training with patch dropout, the
        prefix tokens and the kept patch tokens). ``patch_drop``: the patch-dropout rate of this call in
        training (a schedule passes it step by step); None: ``config.patch_drop``. Evaluation never drops."""
        return self._features(x, patch_drop)

    def _features(self, x: torch.Tensor, patch_drop: Optional[float] = None, head_tokens: Optional[int] = None):
        """:meth:`forward_features`, the last block for the first ``head_tokens`` tokens only (None: all)."""
        if fast_inference(self):  # whole images in chunks (CPU) that keep each block's temporaries in reused memory
            x, grid = self.embed(x)
            per = self.kernel_plan.images_per_chunk(x.shape[0], x.shape[1], widest_row(self.config, x.dtype), x.device)
            if per < x.shape[0]:
                return torch.cat([self.norm(self._run_blocks(c, grid, head_tokens=head_tokens)[0])
                                  for c in x.split(per)])
            return self.norm(self._run_blocks(x, grid, head_tokens=head_tokens)[0])
        x, grid = self.embed(x)
        rate = self.config.patch_drop if patch_drop is None else float(patch_drop)
        x, _, _ = self._run_blocks(x, grid, patch_drop=rate, head_tokens=head_tokens)
        return self.norm(x)

    def forward_tokens(self, tokens: torch.Tensor, grid: Grid) -> torch.Tensor:
        """Eq. 2-4 on tokens from :meth:`embed` (perhaps altered, e.g. masked for MPP): positions, blocks, LN."""
        x, _, _ = self._run_blocks(tokens, grid)
        return self.norm(x)

    def pool(self, tokens: torch.Tensor) -> torch.Tensor:
        """Eq. 4's read-out: token 0, the mean of the patch tokens (GAP) or their attention pooling (MAP),
        then the final LayerNorm when it comes after pooling (``final_norm="pooled"``). With a distillation
        token read out by its own head (``distill_head``), the mean of the class and distillation tokens (the
        features timm's DeiT gives). Register tokens are never pooled."""
        cfg = self.config
        if self.dist_token is not None and cfg.distill_head:
            out = (tokens[:, 0] + tokens[:, 1]) / 2
        elif cfg.pool == "token":
            out = tokens[:, 0]
        elif cfg.pool == "map":
            out = self.attn_pool(tokens[:, cfg.num_prefix_tokens:])
        else:
            out = tokens[:, cfg.num_prefix_tokens:].mean(dim=1)
        return out if self.fc_norm is None else self.fc_norm(out)

    def read_out(self, tokens: torch.Tensor) -> HeadOutputs:
        """The head on the final tokens (all of them, or the leading ones it reads): pool once, the pre-logits
        layer, the head. With a distillation token the logits are the mean of the class head (on token 0) and
        the distillation head (on token 1), both kept in ``heads`` for a loss on each (DeiT)."""
        feats = self.pre_logits(self.pool(tokens))
        if self.head_dist is None:
            return HeadOutputs(self.head(self.head_drop(feats)), feats)
        both = (self.head(tokens[:, 0]), self.head_dist(tokens[:, 1]))
        return HeadOutputs((both[0] + both[1]) / 2, feats, both)

    def forward_head(self, tokens: torch.Tensor, pre_logits: bool = False):
        """Pool the final tokens, apply the pre-logits layer, then (unless ``pre_logits``) the head
        (:meth:`read_out`'s ``features`` or ``logits``)."""
        out = self.read_out(tokens)
        return out.features if pre_logits else out.logits

    def forward_outputs(self, x: torch.Tensor, *, patch_drop: Optional[float] = None) -> HeadOutputs:
        """Images -> :class:`HeadOutputs` (logits and pooled features) in one pass: the head's contract, what
        :meth:`forward`, ``vitkit serve``, the exporters and the benchmarks call. The last block computes the
        tokens the head reads only (``kernel_plan.head_tokens``; hooks on it see those rows), the same logits
        as every token would give; ``forward_features`` gives every token. ``patch_drop``: as in
        :meth:`forward_features`."""
        return self.read_out(self._features(x, patch_drop, self.kernel_plan.head_tokens))

    def forward(self, x: torch.Tensor, return_attention: bool = False, *, patch_drop: Optional[float] = None):
        """Logits [B, classes] (:meth:`forward_outputs`); with ``return_attention=True`` also the list of L
        attention maps [B, heads, T, T], computed by the explicit path for this call only."""
        if return_attention:
            out = self.forward_intermediates(x, output_fmt="dict", return_attention=True)
            return self.forward_head(out["features"]), out["attention"]
        return self.forward_outputs(x, patch_drop=patch_drop).logits

    # --- bookkeeping ------------------------------------------------------------------
    def num_params(self, trainable_only: bool = False) -> int:
        """The number of parameters (only those that train, with ``trainable_only``)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def no_weight_decay(self) -> set:
        """Names of parameters the paper's recipes exclude from weight decay."""
        return {n for n, p in self.named_parameters()
                if p.ndim <= 1 or n.startswith(("cls_token", "dist_token", "reg_token", "pos_embed")) or ".table" in n
                or n.endswith(".cls") or n == "attn_pool.latent"}

    def extra_repr(self) -> str:
        """The config in one line of ``print(model)``."""
        c = self.config
        return (f"name={c.name}, img_size={c.img_size}, patch_size={c.patch_size}, width={c.width}, "
                f"depth={c.depth}, heads={c.num_heads}, posemb={c.posemb}, pool={c.pool}"
                + (", distill_token=True" if c.distill_token else "")
                + (f", reg_tokens={c.reg_tokens}" if c.reg_tokens else "")
                + (f", layer_scale={c.layer_scale:g}" if c.layer_scale is not None else "")
                + (", norm_pre=True" if c.norm_pre else "") + (f", gelu={c.gelu}" if c.gelu != "exact" else "")
                + (f", final_norm={c.final_norm}" if c.final_norm != "tokens" else ""))
