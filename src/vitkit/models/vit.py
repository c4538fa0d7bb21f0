"""The Vision Transformer (Eq. 1-4), driven entirely by a ViTConfig."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..config import ViTConfig
from ..errors import InputError
from .backend import compiling, graph_capture
from .intermediates import check_output_fmt, feature_pyramid, resolve_indices, timm_layout
from .kernels import inference_gemms
from .layers import (
    AttentionPool,
    AxialBlock,
    Block,
    PatchEmbed,
    check_images,
    chunk_images,
    fast_inference,
    lecun_normal_,
    patch_dropout,
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
from .readout import readout_rows
from .resnet import HybridEmbed
from .tune import block_on, encoder_gemm, encoder_shape, training_gemms_of, widest_row

Grid = Tuple[int, int]


class VisionTransformer(nn.Module):
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
        if cfg.backbone == "resnet":  # hybrid (Section 3.1): patches of a BiT ResNet feature map
            self.patch_embed = HybridEmbed(cfg.in_chans, d, cfg.patch_size, cfg.backbone_layers, cfg.backbone_width,
                                           std_eps=cfg.std_conv_eps, std_style=cfg.std_conv_style,
                                           gn_eps=cfg.gn_eps, pad=cfg.dynamic_img_pad)
        else:
            self.patch_embed = PatchEmbed(cfg.patch_size, cfg.in_chans, d, pad=cfg.dynamic_img_pad, bias=cfg.patch_bias)
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
        self.head = nn.Linear(rep or d, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        # DeiT: the distillation token's own head
        self.head_dist = (nn.Linear(d, cfg.num_classes)
                          if cfg.distill_token and cfg.distill_head and cfg.num_classes > 0 else None)
        self.grad_checkpointing = False
        self.reset_parameters()

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
        check_images(self.config, x)
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
                    stop_after: Optional[int] = None, patch_drop: float = 0.0, rows: Optional[int] = None
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
            x = patch_dropout(x, cfg.num_prefix_tokens, patch_drop)
        if self.norm_pre is not None:
            x = self.norm_pre(x)
        biases = None
        if self.rel_pos is not None:
            biases = [rel(grid, cfg.posemb_resize) for rel in self.rel_pos]
        saved, maps = {}, {}
        keep = set(keep)
        ckpt = self.grad_checkpointing and self.training and torch.is_grad_enabled() and not need_weights
        axial = {"grid": grid} if cfg.attention == "axial" else {}  # axial blocks attend along the grid
        gemms = training_gemms_of(cfg, x, self.blocks)  # the training products' libraries (tune.py)
        for i, blk in enumerate(self.blocks):
            if pe is not None and every:
                x = x + pe[i if pe.shape[0] > 1 else 0]
            bias = None if biases is None else biases[i if len(biases) > 1 else 0]
            last = {"rows": rows} if rows is not None and i == len(self.blocks) - 1 else {}
            x, w = (checkpoint(block_on, blk, gemms, x, bias, use_reentrant=False, **axial, **last) if ckpt
                    else block_on(blk, gemms, x, bias, need_weights and i in keep, **axial, **last))
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

    def readout_rows(self) -> Optional[int]:
        """Leading tokens the logits read from the last block, which :meth:`forward` computes for them only
        (None: every token): :func:`vitkit.models.readout.readout_rows`."""
        return readout_rows(self)

    def _features(self, x: torch.Tensor, patch_drop: Optional[float] = None, rows: Optional[int] = None):
        """:meth:`forward_features`, the last block for the first ``rows`` tokens only (None: all)."""
        if fast_inference(self):  # whole images in chunks (CPU) that keep each block's temporaries in reused memory,
            cfg = self.config     # the products on the library that runs blocks of this shape faster
            dtype = next(p.dtype for p in self.parameters() if p.is_floating_point())
            with inference_gemms(encoder_gemm(dtype, x.device, *encoder_shape(cfg, dtype))):
                x, grid = self.embed(x)
                per = chunk_images(x.shape[0], x.shape[1], widest_row(cfg, dtype), device=x.device)
                if per < x.shape[0]:
                    return torch.cat([self.norm(self._run_blocks(c, grid, rows=rows)[0]) for c in x.split(per)])
                return self.norm(self._run_blocks(x, grid, rows=rows)[0])
        x, grid = self.embed(x)
        rate = self.config.patch_drop if patch_drop is None else float(patch_drop)
        x, _, _ = self._run_blocks(x, grid, patch_drop=rate, rows=rows)
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

    def forward_head(self, tokens: torch.Tensor, pre_logits: bool = False):
        """Pool the final tokens, apply the pre-logits layer, then (unless ``pre_logits``) the head.

        With a distillation token the logits are the mean of the class head (on token 0) and the
        distillation head (on token 1)."""
        if self.head_dist is not None and not pre_logits:
            cls, dist = self.head(tokens[:, 0]), self.head_dist(tokens[:, 1])
            return (cls + dist) / 2
        feats = self.pre_logits(self.pool(tokens))
        return feats if pre_logits else self.head(feats)

    def forward(self, x: torch.Tensor, return_attention: bool = False, *, patch_drop: Optional[float] = None):
        """Logits [B, classes]; with ``return_attention=True`` also the list of L attention maps
        [B, heads, T, T], computed by the explicit path for this call only. ``patch_drop``: as in
        :meth:`forward_features`. The last block runs for the tokens the head reads only (:meth:`readout_rows`)."""
        if return_attention:
            out = self.forward_intermediates(x, return_attention=True)
            return self.forward_head(out["features"]), out["attention"]
        rows = None if graph_capture() and not compiling() else self.readout_rows()
        return self.forward_head(self._features(x, patch_drop, rows))

    def forward_intermediates(self, x: torch.Tensor, indices: Union[None, int, Sequence[int]] = None, *,
                              return_attention: bool = False, norm: bool = False, stop_early: bool = False,
                              output_fmt: Optional[str] = None, return_prefix_tokens: bool = False,
                              intermediates_only: bool = False) -> Any:
        """Outputs of chosen blocks (and their attention maps), keyed by name.

        ``indices``: None for every block, an int n for the last n, or a list
        (negative indices count from the end). Returns a dict with
        ``indices``, ``intermediates`` (tokens after each chosen block, final
        LN applied if ``norm``), ``attention`` (maps [B, heads, T, T] of the
        chosen blocks, when asked), ``grid`` and ``features`` (final normed
        tokens; None when ``stop_early`` stops after the last chosen block).

        With ``output_fmt`` ("NCHW" or "NLC") the return value is timm's instead: ``(features,
        intermediates)``, or the intermediates alone with ``intermediates_only``; each intermediate is the
        patch tokens as a map [B, D, rows, cols] (NCHW) or [B, N, D] (NLC), paired with its prefix tokens
        [B, prefix, D] (class, registers) as ``(map, prefix)`` when ``return_prefix_tokens``.
        """
        check_output_fmt(output_fmt)
        idx = resolve_indices(indices, len(self.blocks))
        tokens, grid = self.embed(x)
        last = max(idx) if stop_early or intermediates_only else None
        tokens, saved, maps = self._run_blocks(tokens, grid, idx, return_attention, last)
        inter = [self.norm(saved[i]) if norm else saved[i] for i in idx]
        feats = None if last is not None and last < len(self.blocks) - 1 else self.norm(tokens)
        if output_fmt is not None:
            out = timm_layout(inter, grid, self.config.num_prefix_tokens, output_fmt, return_prefix_tokens)
            return out if intermediates_only else (feats, out)
        out = {"indices": idx, "intermediates": inter, "grid": grid, "features": feats}
        if return_attention:
            out["attention"] = [maps[i] for i in idx]
        return out

    def forward_feature_maps(self, x: torch.Tensor, indices: Union[int, Sequence[int]] = 4,
                             scales: Optional[Sequence[float]] = None, norm: bool = False) -> List[torch.Tensor]:
        """Feature maps for dense tasks (timm's ``features_only``): the patch tokens of the chosen blocks
        (default: the last 4) as maps [B, D, rows, cols], all at the patch stride. ``scales`` makes them a
        pyramid, one scale per map (e.g. ``(4, 2, 1, 0.5)``: strides P/4 ... 2P, as ViTDet's simple feature
        pyramid but without parameters): up by bilinear interpolation, down by average pooling."""
        maps = self.forward_intermediates(x, indices, norm=norm, output_fmt="NCHW", intermediates_only=True)
        return maps if scales is None else feature_pyramid(maps, scales)

    def feature_info(self, indices: Union[int, Sequence[int]] = 4) -> List[Dict[str, Any]]:
        """timm-style description of :meth:`forward_feature_maps`: the block, channels and stride of each map."""
        stride = self.config.pixel_patch_size[0]
        return [{"module": f"blocks.{i}", "num_chs": self.config.width, "reduction": stride}
                for i in resolve_indices(indices, len(self.blocks))]

    def reset_classifier(self, num_classes: int) -> "VisionTransformer":
        """A new zero-initialised head (the paper's fine-tuning head) for ``num_classes`` classes (0: none);
        the old class names no longer apply and are dropped."""
        if num_classes < 0:
            raise InputError(f"num_classes must be 0 or more, got {num_classes}")
        cfg = self.config = self.config.replace(num_classes=num_classes)
        ref = next(self.parameters())
        def zero_head(n_in: int) -> nn.Module:
            if not num_classes:
                return nn.Identity()
            lin = nn.Linear(n_in, num_classes, device=ref.device, dtype=ref.dtype)
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)
            return lin
        self.head = zero_head(cfg.representation_size or cfg.width)
        if self.head_dist is not None or (cfg.distill_token and cfg.distill_head):
            self.head_dist = zero_head(cfg.width) if num_classes else None
        self.meta.labels = None
        return self

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
