"""Roofline: how fast could the model run if it did nothing but its matrix products?

The model's forward pass is a list of GEMMs (patch embedding, qkv, QK^T, AV,
output projection, MLP, head). We time each distinct shape on this machine,
in the benchmark's dtype, with the fastest implementation torch offers for
it, and add up ``flops / rate``: that is the least time a forward pass can
take here. A measured throughput divided by this bound is the fraction of
the roofline reached (1.0 = as fast as the bare GEMMs).

GEMM candidates on a CPU: ATen's kernel (``F.linear``: MKL in fp32, oneDNN
in bf16) and oneDNN's linear primitive, the two libraries torch can reach;
in bf16 also the same product on the fp32 units (bf16 operands widened exactly to fp32, fp32
accumulation, result rounded to bf16; the numbers a native bf16 GEMM with
fp32 accumulation gives). The faster one sets the bound. Each rate is the
bare product (no bias) and the fastest of its repeats, so the bound is as
high as this machine allows: fractions are conservative.

The products are those the logits need: where the head reads only the class token (token pooling), the
last block's queries, attention rows, output projection and MLP for that token alone, as vitkit's model
computes them in inference (:attr:`vitkit.ViTConfig.head_tokens`); a library that computes
every token's last block does ~7% more products at B/16 than the bound counts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from ..config import ViTConfig
from ..models.cost import cost
from ..models.inference import resolve_dtype
from ..models.ops import onednn_ok
from ..timing import alternate, synchronizer


@dataclass(frozen=True)
class Gemm:
    """``count`` products per forward, each ``groups`` independent [M, K] x [K, N] products."""

    name: str
    m: int
    k: int
    n: int
    groups: int = 1
    count: int = 1

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n * self.groups * self.count

    @property
    def shape(self) -> Tuple[int, int, int, int]:
        return (self.groups, self.m, self.k, self.n)


def model_gemms(cfg: ViTConfig, batch: int = 1, img_size=None, rows: Optional[int] = None) -> List[Gemm]:
    """The matrix products of one forward pass of ``batch`` images, as in :func:`vitkit.models.cost.cost`;
    ``rows``: the last block computes only that many leading tokens (queries; every token a key and value)."""
    c = cost(cfg, img_size)
    t, d, m, h, L = c.tokens, cfg.width, cfg.mlp_dim, cfg.num_heads, cfg.depth
    n = c.grid[0] * c.grid[1]
    ph, pw = cfg.patch_size
    in_ch = c.macs_breakdown["patch_embed"] // max(n * ph * pw * d, 1)
    hd = d // h
    full = L if rows is None or rows >= t or cfg.attention != "global" else L - 1
    out = [
        Gemm("patch_embed", batch * n, in_ch * ph * pw, d),
        Gemm("qkv", batch * t, d, 3 * d, count=full),
        Gemm("attn_scores", t, hd, t, groups=batch * h, count=full),
        Gemm("attn_values", t, t, hd, groups=batch * h, count=full),
        Gemm("attn_proj", batch * t, d, d, count=full),
        Gemm("fc1", batch * t, d, m, count=full),
        Gemm("fc2", batch * t, m, d, count=full),
    ]
    if full < L:  # the last block for the read-out rows
        r = batch * rows
        out += [Gemm("last_kv", batch * t, d, 2 * d), Gemm("last_q", r, d, d),
                Gemm("last_attn_scores", rows, hd, t, groups=batch * h),
                Gemm("last_attn_values", rows, t, hd, groups=batch * h),
                Gemm("last_attn_proj", r, d, d), Gemm("last_fc1", r, d, m), Gemm("last_fc2", r, m, d)]
    out = [g for g in out if g.count]
    rep = cfg.representation_size
    if rep:
        out.append(Gemm("pre_logits", batch, d, rep))
    if cfg.num_classes:
        out.append(Gemm("head", batch, rep or d, cfg.num_classes))
    return out


def _candidates(g: Gemm, dtype: torch.dtype, device: str, rows: Optional[int] = None
                ) -> Dict[str, Callable[[], torch.Tensor]]:
    """Implementations of one product in ``dtype`` (inputs made once, outside the timed call)."""
    m = min(g.m, rows) if rows else g.m
    gen = torch.Generator().manual_seed(0)
    make = lambda *s: torch.randn(*s, generator=gen).to(device=device, dtype=dtype)  # noqa: E731
    cands: Dict[str, Callable[[], torch.Tensor]] = {}
    if g.groups == 1:
        x, w = make(m, g.k), make(g.n, g.k)
        cands["native"] = lambda: F.linear(x, w)  # ATen: MKL in fp32, oneDNN in bf16 on a CPU
        if device == "cpu" and onednn_ok(dtype):  # oneDNN's linear primitive
            cands["onednn"] = lambda: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
        if dtype != torch.float32 and device == "cpu":
            cands["fp32_units"] = lambda: F.linear(x.float(), w.float()).to(dtype)
    else:
        a, bm = make(g.groups, m, g.k), make(g.groups, g.k, g.n)
        cands["native"] = lambda: torch.bmm(a, bm)
        if dtype != torch.float32 and device == "cpu":
            cands["fp32_units"] = lambda: torch.bmm(a.float(), bm.float()).to(dtype)
    return cands


@dataclass
class GemmRate:
    gemm: Gemm
    flops_per_s: float
    impl: str
    all_rates: Dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        g = self.gemm
        return {"name": g.name, "groups": g.groups, "m": g.m, "k": g.k, "n": g.n, "count": g.count,
                "gflop": g.flops / 1e9, "gflops_per_s": self.flops_per_s / 1e9, "impl": self.impl,
                "candidates_gflops_per_s": {k: v / 1e9 for k, v in self.all_rates.items()}}


def gemm_rate(g: Gemm, dtype: str = "fp32", device: str = "cpu", repeats: int = 5,
              probe_rows: int = 1024) -> GemmRate:
    """Fastest FLOP rate of one product shape (no bias: the bare matrix multiply).

    Candidates are first compared on at most ``probe_rows`` rows (a slow fallback kernel would otherwise take
    minutes); every one within 2x of the probe's fastest is then timed at the full shape, alternated, and the
    fastest there sets the rate (a probe on fewer rows can rank close libraries the other way round: on an AMD
    EPYC a probe once put MKL's fp32 products, 1.3x slower than oneDNN's at the model's shapes, in the bound).
    The rate is that of the *fastest* repeat: other processes can only slow a repeat down, and a bound should
    not be lowered by them."""
    dt = resolve_dtype(dtype)
    sync = synchronizer(device)
    one = Gemm(g.name, g.m, g.k, g.n, g.groups, 1)
    probe_m = min(g.m, probe_rows)
    cands = _candidates(one, dt, device, rows=probe_m)
    rates: Dict[str, float] = {}
    keep = list(cands)
    if len(cands) > 1:
        probe_flops = 2 * probe_m * g.k * g.n * g.groups
        st = alternate(cands, warmup=1, repeats=3, sync=sync, min_seconds=0.05)
        rates = {k: probe_flops / s.best for k, s in st.items()}
        keep = [k for k in cands if rates[k] >= max(rates.values()) / 2]
    full = cands if probe_m == g.m else _candidates(one, dt, device)
    st = alternate({k: full[k] for k in keep}, warmup=1, repeats=repeats, sync=sync, min_seconds=0.1)
    rates.update({k: 2 * g.m * g.k * g.n * g.groups / s.best for k, s in st.items()})
    best = max(keep, key=rates.get)
    return GemmRate(g, rates[best], best, rates)


@dataclass
class Roofline:
    """Least seconds per image that the model's GEMMs allow at the measured rates."""

    dtype: str
    batch: int
    gflop_per_image: float
    seconds_per_image: float
    rates: List[GemmRate]
    note: str = ""

    @property
    def images_per_s(self) -> float:
        return 1.0 / self.seconds_per_image

    def fraction(self, images_per_s: float) -> float:
        """Share of the roofline reached by a measured throughput."""
        return images_per_s * self.seconds_per_image

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "batch": self.batch, "gflop_per_image": self.gflop_per_image,
                "roofline_images_per_s": self.images_per_s, "effective_gflops_per_s":
                self.gflop_per_image / self.seconds_per_image, "note": self.note,
                "gemms": [r.to_dict() for r in self.rates]}


def roofline(cfg: ViTConfig, batch: int, dtype: str = "fp32", device: str = "cpu", img_size=None,
             repeats: int = 5, progress: Optional[Callable[[str], None]] = None) -> Roofline:
    """Measure every distinct GEMM shape of the products ``batch`` images' logits need (:func:`model_gemms`
    with the model's read-out rows) and add up the bound."""
    rows = cfg.head_tokens
    gemms = model_gemms(cfg, batch, img_size, rows)
    skipped = sum(g.flops for g in model_gemms(cfg, batch, img_size)) - sum(g.flops for g in gemms)
    seen: Dict[Tuple[int, int, int, int], GemmRate] = {}
    rates = []
    for g in gemms:
        if g.shape not in seen:
            if progress:
                progress(f"GEMM {g.name} {g.groups}x[{g.m}x{g.k}]x[{g.k}x{g.n}] {dtype}")
            seen[g.shape] = gemm_rate(g, dtype, device, repeats)
        r = seen[g.shape]
        rates.append(GemmRate(g, r.flops_per_s, r.impl, r.all_rates))
    seconds = sum(r.gemm.flops / r.flops_per_s for r in rates)
    gemm_flops = sum(g.flops for g in gemms)
    total = cost(cfg, img_size).flops * batch - skipped
    note = ""
    if total > gemm_flops:  # e.g. a hybrid's ResNet: counted at the best rate measured (optimistic bound)
        best = max(r.flops_per_s for r in rates)
        seconds += (total - gemm_flops) / best
        note = f"{(total - gemm_flops) / 1e9 / batch:.2f} GFLOP/image outside the listed GEMMs counted at the best rate"
    return Roofline(dtype, batch, total / batch / 1e9, seconds / batch, rates, note)


def peak_gemm(dtype: str = "fp32", device: str = "cpu", size: int = 2048, repeats: int = 5) -> GemmRate:
    """The machine's rate on a large square product, for reference."""
    return gemm_rate(Gemm("square", size, size, size), dtype, device, repeats, probe_rows=512)
