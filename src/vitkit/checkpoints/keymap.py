"""The small engine behind every foreign layout: a key map is data, a list of :class:`Rule`.

A rule ties one vitkit key (``blocks.{i}.attn.qkv.weight``) to one or more
foreign keys and a :class:`Codec`, the pair of tensor reshapes between the
two sides. ``{i}`` stands for the block index. A foreign key may have older
spellings (``aliases``): they are read, the first spelling is written.

``to_vitkit`` consumes foreign keys rule by rule and reports what it could
not place; ``from_vitkit`` runs the same rules backwards. Format modules add
only what a table cannot say (config inference, a few cross-key fixes).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor

State = Dict[str, Tensor]


@dataclass(frozen=True)
class Context:
    """What a codec may need to know about the model: width and heads."""

    width: int
    num_heads: int

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads


@dataclass(frozen=True)
class Codec:
    """``load``: foreign tensors (one per foreign key) -> the vitkit tensor; ``save``: the reverse."""

    name: str
    load: Callable[[Sequence[Tensor], Context], Tensor]
    save: Callable[[Tensor, Context], Sequence[Tensor]]


def _one(fn_load, fn_save, name):
    return Codec(name, lambda ts, c: fn_load(ts[0], c), lambda t, c: [fn_save(t, c)])


COPY = _one(lambda t, c: t, lambda t, c: t, "copy")
# Flax Dense kernel [in, out] <-> torch Linear weight [out, in]
DENSE = _one(lambda t, c: t.transpose(0, 1), lambda t, c: t.transpose(0, 1), "dense")
# Flax Conv kernel [kh, kw, in, out] (HWIO) <-> torch [out, in, kh, kw]
CONV_HWIO = _one(lambda t, c: t.permute(3, 2, 0, 1), lambda t, c: t.permute(2, 3, 1, 0), "conv_hwio")
# Flax attention output kernel [heads, head_dim, D] <-> torch Linear weight [D, heads*head_dim]
ATTN_OUT = _one(lambda t, c: t.reshape(-1, t.shape[-1]).transpose(0, 1),
                lambda t, c: t.transpose(0, 1).reshape(c.num_heads, c.head_dim, -1), "attn_out")
# Flax q/k/v kernels [D, heads, head_dim] x3 <-> fused torch qkv weight [3*D, D]
QKV_HEADS = Codec(
    "qkv_heads",
    lambda ts, c: torch.cat([t.reshape(t.shape[0], -1).transpose(0, 1) for t in ts], 0),
    lambda t, c: [p.transpose(0, 1).reshape(-1, c.num_heads, c.head_dim) for p in t.chunk(3, 0)])
# Flax q/k/v biases [heads, head_dim] x3 <-> fused bias [3*D]
QKV_HEADS_BIAS = Codec(
    "qkv_heads_bias",
    lambda ts, c: torch.cat([t.reshape(-1) for t in ts], 0),
    lambda t, c: [p.reshape(c.num_heads, c.head_dim) for p in t.chunk(3, 0)])
# separate torch q/k/v Linear weights or biases <-> fused (rows q; k; v)
QKV_CAT = Codec("qkv_cat", lambda ts, c: torch.cat(list(ts), 0), lambda t, c: list(t.chunk(3, 0)))
# a token [D] or a position table [tokens, D] stored without the batch axis <-> [1, 1, D] / [1, tokens, D]
UNBATCHED = _one(lambda t, c: t.reshape(1, -1, t.shape[-1]),
                 lambda t, c: t.reshape(-1, t.shape[-1]).squeeze(0) if t.shape[1] == 1 else t[0], "unbatched")


@dataclass(frozen=True)
class Rule:
    ours: str
    theirs: Tuple[str, ...]  # one key, or three for q/k/v
    codec: Codec = COPY
    aliases: Tuple[Tuple[str, ...], ...] = ()  # older spellings of ``theirs``, read only
    optional: bool = False  # e.g. pre-logits, head, biases

    @property
    def per_block(self) -> bool:
        return "{i}" in self.ours


def rule(ours: str, theirs, codec: Codec = COPY, aliases=(), optional: bool = False) -> Rule:
    theirs = (theirs,) if isinstance(theirs, str) else tuple(theirs)
    aliases = tuple((a,) if isinstance(a, str) else tuple(a) for a in aliases)
    return Rule(ours, theirs, codec, aliases, optional)


def linear(ours: str, theirs: str, codec: Codec = COPY, aliases=(), optional: bool = False,
           weight: str = "weight", bias: str = "bias") -> List[Rule]:
    """Two rules for a layer with a weight and a bias (names of the parameters on their side given)."""
    return [rule(f"{ours}.weight", f"{theirs}.{weight}", codec,
                 [f"{a}.{weight}" for a in aliases], optional),
            rule(f"{ours}.bias", f"{theirs}.{bias}", COPY, [f"{a}.{bias}" for a in aliases], optional)]


@dataclass
class Mapped:
    """Result of a conversion: the new state, what each side left over."""

    state: State
    unused: List[str] = field(default_factory=list)  # foreign keys no rule took
    missing: List[str] = field(default_factory=list)  # required rules with no foreign key


def show_keys(keys, most: int = 12) -> str:
    """The first ``most`` keys, comma-separated, and how many more there are (for one-line errors)."""
    keys = list(keys)
    return ", ".join(keys[:most]) + (f" ... and {len(keys) - most} more" if len(keys) > most else "")


def layout_error(source: str, fmt: str, mapped: Mapped) -> ValueError:
    """The error for tensors recognised as ``fmt`` whose keys do not all map: which are foreign, which missing."""
    parts = [f"{source}: recognised as the {fmt} layout ({len(mapped.state)} tensors mapped)"]
    if mapped.unused:
        parts.append(f"but {len(mapped.unused)} key(s) are not part of vitkit's ViT in that layout: "
                     f"{show_keys(mapped.unused)}")
    if mapped.missing:
        parts.append(f"{'and' if mapped.unused else 'but'} {len(mapped.missing)} expected key(s) are missing: "
                     f"{show_keys(mapped.missing)}")
    parts.append("(a different architecture, e.g. QK normalisation, a SwiGLU MLP or a text tower, or an "
                 "incomplete file)")
    return ValueError(", ".join(parts[:-1]) + " " + parts[-1])


def check_mapped(mapped: Mapped, source: str, fmt: str) -> None:
    """Every foreign key taken and every required key found, else :func:`layout_error`."""
    if mapped.unused or mapped.missing:
        raise layout_error(source, fmt, mapped)


def count_blocks(keys, pattern: str) -> int:
    """Number of blocks, from a key pattern with ``{i}`` (``blocks.{i}.norm1.weight``)."""
    rx = re.compile("^" + re.escape(pattern).replace(r"\{i\}", r"(\d+)") + "$")
    idx = [int(m.group(1)) for k in keys for m in [rx.match(k)] if m]
    return max(idx) + 1 if idx else 0


def _expand(pattern: str, i: Optional[int]) -> str:
    return pattern if i is None else pattern.replace("{i}", str(i))


def _walk(state: Mapping[str, Tensor], rules: Sequence[Rule], depth: int,
          move: Callable[[Rule, Optional[int], State], Optional[List[str]]],
          lacking: Callable[[Rule, Optional[int]], str]) -> Mapped:
    """What both directions share: every rule at every block index (None for a rule outside the blocks).
    ``move(rule, i, out)`` writes the rule's tensors into ``out`` and returns the keys of ``state`` it read,
    or None where ``state`` lacks them: a required rule then reports ``lacking(rule, i)`` as missing. The keys
    of ``state`` that no rule read are unused."""
    out: State = {}
    used = set()
    missing = []
    for r in rules:
        for i in (range(depth) if r.per_block else [None]):
            read = move(r, i, out)
            if read is not None:
                used.update(read)
            elif not r.optional:
                missing.append(lacking(r, i))
    return Mapped(out, [k for k in state if k not in used], missing)


def to_vitkit(state: Mapping[str, Tensor], rules: Sequence[Rule], depth: int, ctx: Context) -> Mapped:
    def move(r: Rule, i: Optional[int], out: State) -> Optional[List[str]]:
        for spelling in (r.theirs,) + r.aliases:  # the first spelling present in full
            keys = [_expand(k, i) for k in spelling]
            if all(k in state for k in keys):
                out[_expand(r.ours, i)] = r.codec.load([state[k] for k in keys], ctx).contiguous()
                return keys
        return None

    return _walk(state, rules, depth, move, lambda r, i: _expand(r.theirs[0], i))


def from_vitkit(state: Mapping[str, Tensor], rules: Sequence[Rule], depth: int, ctx: Context) -> Mapped:
    def move(r: Rule, i: Optional[int], out: State) -> Optional[List[str]]:
        key = _expand(r.ours, i)
        if key not in state:
            return None
        for k, t in zip(r.theirs, r.codec.save(state[key], ctx)):
            out[_expand(k, i)] = t.contiguous()
        return [key]

    return _walk(state, rules, depth, move, lambda r, i: _expand(r.ours, i))


def signature_hits(keys, rules: Sequence[Rule]) -> int:
    """How many foreign keys of ``keys`` some rule (any spelling, block 0..n) would take."""
    pats = []
    for r in rules:
        for spelling in (r.theirs,) + r.aliases:
            for k in spelling:
                pats.append(re.compile("^" + re.escape(k).replace(r"\{i\}", r"\d+") + "$"))
    return sum(1 for k in keys if any(p.match(k) for p in pats))
