"""BiT ResNet front-end of the hybrid ViT (Section 3.1, "Hybrid Architecture").

The hybrid feeds Eq. 1 with patches of a CNN feature map instead of raw
image patches. The CNN is the BiT ResNet of the authors' code: weight-
standardised convolutions, GroupNorm with 32 groups, ReLU, bottleneck units
(1x1 -> 3x3 -> 1x1, stride on the 3x3) with a projection shortcut, a 7x7
stride-2 root conv and a 3x3 stride-2 max-pool. Every stride-2 op uses
TensorFlow "SAME" padding (extra padding on the bottom/right), as the Flax
code does, so a 224 px image gives exactly the authors' feature maps.

Numerics are parameters, because the two references differ:
the authors' Flax code standardises kernels as (w - mean) / (std + 1e-5) and
uses GroupNorm eps 1e-6 (``std_style="std"``); timm's port uses
(w - mean) / sqrt(var + 1e-8) and GroupNorm eps 1e-5 (``std_style="var"``).

State-dict keys (below ``patch_embed.backbone.``): ``conv_root``,
``gn_root``, ``stages.{i}.{j}.{conv1,gn1,conv2,gn2,conv3,gn3,conv_proj,gn_proj}``
(stage i, unit j, both from 0), mirroring the authors' names
``block{i+1}/unit{j+1}/...``.

For small images the same trunk takes the shape of the CIFAR ResNets (He et
al. 2016, Section 4.2) and of the usual "ResNet-18 for 32 px": ``stem="3x3"``
is one 3x3 stride-1 convolution without max-pool (the full resolution reaches
the first stage), ``unit="basic"`` the two-convolution unit of ResNet-18/34
(3x3 -> 3x3, no expansion; keys ``conv1, gn1, conv2, gn2`` and the
projection). Same weight standardisation and GroupNorm as the BiT units.
"""
from __future__ import annotations

import math
from typing import Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..config import BACKBONE_STEMS, BACKBONE_UNITS, trunk_stride
from ..errors import ConfigError, InputError

GN_GROUPS = 32
STD_STYLES = ("std", "var")


def same_padding(size: int, kernel: int, stride: int) -> Tuple[int, int]:
    """TF 'SAME' padding (before, after) along one axis: output = ceil(size / stride)."""
    total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def pad_same(x: torch.Tensor, kernel: int, stride: int, value: float = 0.0) -> torch.Tensor:
    top, bottom = same_padding(x.shape[-2], kernel, stride)
    left, right = same_padding(x.shape[-1], kernel, stride)
    if top or bottom or left or right:
        x = F.pad(x, (left, right, top, bottom), value=value)
    return x


def reduced_size(size: int, stride: int) -> int:
    """Spatial size after ops of total ``stride`` with SAME padding (ceil at every stride-2 step)."""
    return -(-size // stride)


class StdConv2d(nn.Conv2d):
    """Convolution with weight standardisation (per output channel, zero mean and unit spread), no bias.

    ``style="std"``: (w - mean) / (std + eps), the authors' Flax code (eps 1e-5);
    ``style="var"``: (w - mean) / sqrt(var + eps), timm (eps 1e-8). SAME padding.
    """

    def __init__(self, in_chans: int, out_chans: int, kernel: int, stride: int = 1, *,
                 eps: float = 1e-5, style: str = "std"):
        if style not in STD_STYLES:
            raise ConfigError(f"std_conv_style={style!r} is not one of {', '.join(STD_STYLES)}")
        # stride 1 with an odd kernel: SAME is symmetric and static; stride 2 pads per input size in forward
        static = kernel // 2 if stride == 1 else 0
        super().__init__(in_chans, out_chans, kernel, stride=stride, padding=static, bias=False)
        self.eps = eps
        self.style = style

    def standardized_weight(self) -> torch.Tensor:
        w = self.weight
        var, mean = torch.var_mean(w, dim=(1, 2, 3), correction=0, keepdim=True)
        if self.style == "std":
            return (w - mean) / (var.sqrt() + self.eps)
        return (w - mean) * torch.rsqrt(var + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride[0] > 1:
            x = pad_same(x, self.kernel_size[0], self.stride[0])
        return F.conv2d(x, self.standardized_weight(), None, self.stride, self.padding)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", std_style={self.style}, eps={self.eps}"


class ResidualUnit(nn.Module):
    """Bottleneck unit: StdConv 1x1 -> GN -> ReLU -> StdConv 3x3 (stride) -> GN -> ReLU -> StdConv 1x1 -> GN,
    added to the (projected) shortcut, then ReLU."""

    def __init__(self, in_chans: int, mid_chans: int, stride: int = 1, *, std_eps: float = 1e-5,
                 std_style: str = "std", gn_eps: float = 1e-6):
        super().__init__()
        out = 4 * mid_chans
        conv = lambda i, o, k, s=1: StdConv2d(i, o, k, s, eps=std_eps, style=std_style)  # noqa: E731
        gn = lambda c: nn.GroupNorm(GN_GROUPS, c, eps=gn_eps)  # noqa: E731
        self.conv_proj = self.gn_proj = None
        if in_chans != out or stride != 1:  # projection shortcut, as in the authors' code
            self.conv_proj = conv(in_chans, out, 1, stride)
            self.gn_proj = gn(out)
        self.conv1, self.gn1 = conv(in_chans, mid_chans, 1), gn(mid_chans)
        self.conv2, self.gn2 = conv(mid_chans, mid_chans, 3, stride), gn(mid_chans)
        self.conv3, self.gn3 = conv(mid_chans, out, 1), gn(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.conv_proj is None else self.gn_proj(self.conv_proj(x))
        y = F.relu(self.gn1(self.conv1(x)))
        y = F.relu(self.gn2(self.conv2(y)))
        y = self.gn3(self.conv3(y))
        return F.relu(shortcut + y)

    @property
    def last_norm(self) -> nn.GroupNorm:
        return self.gn3


class BasicUnit(nn.Module):
    """ResNet-18/34 unit: StdConv 3x3 (stride) -> GN -> ReLU -> StdConv 3x3 -> GN, added to the (projected)
    shortcut, then ReLU."""

    def __init__(self, in_chans: int, out_chans: int, stride: int = 1, *, std_eps: float = 1e-5,
                 std_style: str = "std", gn_eps: float = 1e-6):
        super().__init__()
        conv = lambda i, o, k, s=1: StdConv2d(i, o, k, s, eps=std_eps, style=std_style)  # noqa: E731
        gn = lambda c: nn.GroupNorm(GN_GROUPS, c, eps=gn_eps)  # noqa: E731
        self.conv_proj = self.gn_proj = None
        if in_chans != out_chans or stride != 1:
            self.conv_proj = conv(in_chans, out_chans, 1, stride)
            self.gn_proj = gn(out_chans)
        self.conv1, self.gn1 = conv(in_chans, out_chans, 3, stride), gn(out_chans)
        self.conv2, self.gn2 = conv(out_chans, out_chans, 3), gn(out_chans)

    @property
    def last_norm(self) -> nn.GroupNorm:
        return self.gn2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.conv_proj is None else self.gn_proj(self.conv_proj(x))
        y = F.relu(self.gn1(self.conv1(x)))
        return F.relu(shortcut + self.gn2(self.conv2(y)))


class ResNet(nn.Module):
    """BiT ResNet trunk without a head: root (7x7/2 conv, GN, ReLU, 3x3/2 max-pool) then stages.

    ``layers``: units per stage, e.g. (3, 4, 9) for the paper's R50 with stage 4
    folded into stage 3, (3, 4, 6, 3) for the full R50, () for the root only.
    Stage i has ``width * 2**i`` bottleneck channels and outputs four times
    that; the first stage keeps the resolution, every later one halves it.
    ``stem="3x3"`` / ``unit="basic"``: the small-image root and the ResNet-18
    unit (stage i then outputs ``width * 2**i`` channels); ``(2, 2, 2, 2)``
    with both is a ResNet-18 for 28-32 px images.
    """

    def __init__(self, in_chans: int = 3, layers: Sequence[int] = (3, 4, 9), width: int = 64, *,
                 std_eps: float = 1e-5, std_style: str = "std", gn_eps: float = 1e-6, stem: str = "bit",
                 unit: str = "bottleneck"):
        super().__init__()
        if stem not in BACKBONE_STEMS or unit not in BACKBONE_UNITS:
            raise ConfigError(f"backbone_stem={stem!r} / backbone_unit={unit!r}: use a stem of "
                              f"{', '.join(BACKBONE_STEMS)} and a unit of {', '.join(BACKBONE_UNITS)}")
        self.layers, self.stem, self.unit = tuple(int(n) for n in layers), stem, unit
        kw = dict(std_eps=std_eps, std_style=std_style, gn_eps=gn_eps)
        k, s = (7, 2) if stem == "bit" else (3, 1)
        self.conv_root = StdConv2d(in_chans, width, k, s, eps=std_eps, style=std_style)
        self.gn_root = nn.GroupNorm(GN_GROUPS, width, eps=gn_eps)
        stages, chans, grow = [], width, BACKBONE_UNITS[unit]
        for i, n in enumerate(self.layers):
            mid = width * 2 ** i
            units = []
            for j in range(n):
                c_in, stride = chans if j == 0 else grow * mid, 2 if (i > 0 and j == 0) else 1
                units.append(BasicUnit(c_in, mid, stride, **kw) if unit == "basic" else
                             ResidualUnit(c_in, mid, stride, **kw))
            stages.append(nn.Sequential(*units))
            chans = grow * mid
        self.stages = nn.Sequential(*stages)
        self.out_chans = chans
        self.reset_parameters()

    @property
    def stride(self) -> int:
        """Total downsampling: the root's (4, or 1 for the 3x3 stem), then 2 per stage after the first."""
        return trunk_stride(self.stem, len(self.layers))

    def reset_parameters(self) -> None:
        """Flax defaults: LeCun-normal kernels, GroupNorm scale 1 / bias 0, the last GN of a unit scale 0."""
        for m in self.modules():
            if isinstance(m, StdConv2d):
                nn.init.normal_(m.weight, std=m.weight[0].numel() ** -0.5)
            elif isinstance(m, nn.GroupNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for m in self.modules():
            if isinstance(m, (ResidualUnit, BasicUnit)):
                nn.init.zeros_(m.last_norm.weight)

    def forward_root(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.gn_root(self.conv_root(x)))
        if self.stem == "3x3":
            return x
        return F.max_pool2d(pad_same(x, 3, 2, value=float("-inf")), 3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.forward_root(x))


class HybridEmbed(nn.Module):
    """Eq. 1 on a ResNet feature map: backbone -> P x P patches of the map (P = 1 in the paper) -> width D.

    Returns the patch grid [B, D, rows, cols], like PatchEmbed.
    """

    def __init__(self, in_chans: int, width: int, patch_size: Tuple[int, int], layers: Sequence[int],
                 backbone_width: int = 64, *, std_eps: float = 1e-5, std_style: str = "std",
                 gn_eps: float = 1e-6, pad: bool = False, stem: str = "bit", unit: str = "bottleneck"):
        super().__init__()
        self.backbone = ResNet(in_chans, layers, backbone_width, std_eps=std_eps, std_style=std_style,
                               gn_eps=gn_eps, stem=stem, unit=unit)
        self.patch_size = tuple(patch_size)
        self.pad = pad
        self.proj = nn.Conv2d(self.backbone.out_chans, width, kernel_size=self.patch_size, stride=self.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.backbone(x)
        (ph, pw), (h, w) = self.patch_size, f.shape[-2:]
        if h % ph or w % pw:
            if not self.pad:
                raise InputError(
                    f"the backbone's {h}x{w} feature map is not divisible by patch {ph}x{pw}: use an image size "
                    f"that is a multiple of {ph * self.backbone.stride} or build with dynamic_img_pad=True")
            f = F.pad(f, (0, (-w) % pw, 0, (-h) % ph))
        return self.proj(f)


def resnet_cost(in_chans: int, layers: Sequence[int], width: int, img_size: Tuple[int, int], *,
                stem: str = "bit", unit: str = "bottleneck") -> dict:
    """Analytical cost of :class:`ResNet` for one image: parameters, conv multiply-adds, output channels and
    activation element counts (peak live in inference; stored for backward in training)."""
    h, w = img_size
    k, s = (7, 2) if stem == "bit" else (3, 1)
    hw = reduced_size(h, s) * reduced_size(w, s)  # root conv output
    params = in_chans * k * k * width + 2 * width
    macs = hw * in_chans * k * k * width
    stored = in_chans * h * w + 3 * width * hw  # input; conv, GN and ReLU outputs of the root
    peak = 2 * width * hw
    fh, fw = reduced_size(h, s), reduced_size(w, s)
    if stem == "bit":  # the max-pool
        fh, fw = reduced_size(h, 4), reduced_size(w, 4)
        peak = width * (fh * fw + hw)
    chans, grow = width, BACKBONE_UNITS[unit]
    for i, n in enumerate(layers):
        mid = width * 2 ** i
        out = grow * mid
        for j in range(n):
            stride = 2 if (i > 0 and j == 0) else 1
            hw_in = fh * fw
            fh, fw = reduced_size(fh, stride), reduced_size(fw, stride)
            hw_out = fh * fw
            if unit == "basic":
                params += chans * 9 * out + out * 9 * out + 4 * out
                macs += hw_out * (chans * 9 * out + out * 9 * out)
                stored += 7 * out * hw_out  # conv/GN/ReLU outputs, the sum and its ReLU
            else:
                params += chans * mid + mid * 9 * mid + mid * out + 2 * (2 * mid + out)
                macs += hw_in * chans * mid + hw_out * (9 * mid * mid + mid * out)
                stored += 2 * mid * hw_in + 4 * mid * hw_out + 3 * out * hw_out  # conv/GN outputs, ReLUs, sum
            if chans != out or stride != 1:
                params += chans * out + 2 * out
                macs += hw_out * chans * out
                stored += 2 * out * hw_out
            peak = max(peak, chans * hw_in + 2 * out * hw_out + (mid * hw_in if unit != "basic" else out * hw_out))
            chans = out
    return dict(params=params, macs=macs, out_chans=chans, feature_size=(fh, fw), act_inference=peak,
                act_train=stored)
