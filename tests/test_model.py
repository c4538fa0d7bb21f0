import pytest
import torch
import torch.nn.functional as F

import vitkit
from _weights import randomize_head
from vitkit import VisionTransformer, create_model
from vitkit.models.kernel_plan import use_backend
from vitkit.models.layers import PatchDropout

POSEMB_VARIANTS = [
    dict(posemb="none"), dict(posemb="learn"), dict(posemb="learn2d"), dict(posemb="relative"),
    dict(posemb="sincos2d"), dict(posemb="learn", posemb_where="every_layer"),
    dict(posemb="learn", posemb_where="every_layer_shared"), dict(posemb="learn2d", posemb_where="every_layer"),
    dict(posemb="relative", posemb_where="every_layer_shared"),
]
POOL_VARIANTS = [dict(pool="token"), dict(pool="gap"), dict(pool="gap", class_token=False)]


@pytest.mark.parametrize("patch", [32, 16, 14, 8])
def test_paper_patch_sizes_shapes(patch):
    size = {32: 64, 16: 32, 14: 28, 8: 16}[patch] * 2
    model = create_model(f"Ti/{patch}", img_size=size, depth=1, num_classes=5).eval()
    out = model.forward_features(torch.randn(2, 3, size, size))
    assert out.shape == (2, 1 + (size // patch) ** 2, 192)
    assert model(torch.randn(2, 3, size, size)).shape == (2, 5)


@pytest.mark.parametrize("name", ["Ti/16", "vit_small_patch16_224", "vit-b16"])
def test_full_size_models_at_224(name):
    model = create_model(name, depth=1).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 224, 224)).shape == (1, 1000)


def test_small_patches_any_channels_and_classes(tiny_cfg):
    for patch, chans in ((2, 1), (4, 4)):
        model = VisionTransformer(tiny_cfg.replace(patch_size=patch, in_chans=chans, img_size=(16, 24),
                                                   num_classes=3))
        assert model(torch.randn(2, chans, 16, 24)).shape == (2, 3)
        assert model.forward_features(torch.randn(1, chans, 16, 24)).shape[1] == 1 + (16 // patch) * (24 // patch)


def test_conv_patch_embedding_equals_flatten_and_linear(tiny_cfg):
    """Eq. 1: the stride-P conv is the linear map E applied to each flattened P x P x C patch."""
    model = VisionTransformer(tiny_cfg.replace(img_size=(32, 48)))
    x = torch.randn(2, 3, 32, 48)
    p, d = 4, tiny_cfg.width
    conv = model.patch_embed(x).flatten(2).transpose(1, 2)
    b, c, h, w = x.shape
    patches = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, c * p * p)
    E = model.patch_embed.proj.weight.reshape(d, -1)
    linear = patches @ E.T + model.patch_embed.proj.bias
    torch.testing.assert_close(conv, linear, rtol=1e-5, atol=1e-5)
    # row-major patch order: token k is patch (k // cols, k % cols)
    torch.testing.assert_close(conv[:, 1 * 12 + 5], F.linear(x[:, :, 4:8, 20:24].reshape(b, -1), E,
                                                             model.patch_embed.proj.bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", POSEMB_VARIANTS + POOL_VARIANTS + [dict(representation_size=32)],
                         ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()))
def test_fused_equals_explicit_attention(tiny_cfg, variant, monkeypatch):
    """The fused kernel (F.scaled_dot_product_attention), which a plan with attention=fused runs at any length,
    against the explicit path that returns weights (the fused kernel really runs: counted below)."""
    from vitkit.models import ops

    calls = []
    fused_kernel = F.scaled_dot_product_attention
    monkeypatch.setattr(ops.F, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or fused_kernel(*a, **k))
    model = randomize_head(VisionTransformer(tiny_cfg.replace(img_size=48, **variant)))
    assert model.set_kernel_plan("attention=fused").attention_for(torch.float32, grad=True) == "fused"
    if model.rel_pos is not None:  # non-zero relative biases so the bias path is exercised
        for rel in model.rel_pos:
            torch.nn.init.normal_(rel.table, std=0.5)
            if rel.cls is not None:
                torch.nn.init.normal_(rel.cls, std=0.5)
    x = torch.randn(3, 3, 48, 48)
    for mode in ("eval", "train"):  # train mode with all dropout rates 0 must agree too
        getattr(model, mode)()
        n = len(calls)
        fused = model(x)
        assert len(calls) - n == tiny_cfg.depth  # every block ran the fused kernel
        explicit, maps = model(x, return_attention=True)
        assert len(calls) - n == tiny_cfg.depth  # the maps come from the explicit path
        torch.testing.assert_close(explicit, fused, rtol=1e-5, atol=1e-5)
    assert len(maps) == tiny_cfg.depth
    t = model.config.seq_len
    assert maps[0].shape == (3, tiny_cfg.num_heads, t, t)
    torch.testing.assert_close(maps[1].sum(-1), torch.ones(3, tiny_cfg.num_heads, t))


@pytest.mark.parametrize("variant", POSEMB_VARIANTS + POOL_VARIANTS,
                         ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()))
def test_every_option_forward_and_backward(tiny_cfg, variant):
    model = randomize_head(VisionTransformer(tiny_cfg.replace(**variant, dropout=0.1, attn_dropout=0.1,
                                                              drop_path=0.1))).train()
    loss = F.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    # With class-token read-out, the last block's output matters only at token 0, whose relative
    # biases are the class-token ones: the last layer's patch-offset table gets no gradient.
    unused = {f"rel_pos.{tiny_cfg.depth - 1}.table"} if variant.get("posemb") == "relative" and \
        variant.get("posemb_where") is None else set()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        if name in unused:
            assert p.grad.abs().sum() == 0
        else:
            assert p.grad.abs().sum() > 0, f"no gradient reaches {name}"


def test_no_class_token_with_gap(tiny_cfg):
    model = VisionTransformer(tiny_cfg.replace(class_token=False, pool="gap"))
    assert model.cls_token is None
    tokens = model.forward_features(torch.randn(2, 3, 32, 32))
    assert tokens.shape == (2, 64, 64)
    torch.testing.assert_close(model.forward_head(tokens), model.head(tokens.mean(1)))


def test_gap_with_class_token_averages_patches_only(tiny_cfg):
    model = randomize_head(VisionTransformer(tiny_cfg.replace(pool="gap")))
    tokens = model.forward_features(torch.randn(2, 3, 32, 32))
    assert tokens.shape[1] == 65
    torch.testing.assert_close(model.forward_head(tokens, pre_logits=True), tokens[:, 1:].mean(1))


def test_pre_logits_head(tiny_cfg):
    model = VisionTransformer(tiny_cfg.replace(representation_size=32))
    tokens = model.forward_features(torch.randn(2, 3, 32, 32))
    rep = model.forward_head(tokens, pre_logits=True)
    assert rep.shape == (2, 32) and rep.abs().max() <= 1  # tanh
    torch.testing.assert_close(rep, torch.tanh(model.pre_logits.fc(tokens[:, 0])))
    assert model.head.in_features == 32


def test_head_is_zero_initialised_and_num_classes_zero(tiny_cfg):
    model = VisionTransformer(tiny_cfg)
    assert model.head.weight.abs().sum() == 0 and model.head.bias.abs().sum() == 0
    feats = VisionTransformer(tiny_cfg.replace(num_classes=0))(torch.randn(2, 3, 32, 32))
    assert feats.shape == (2, 64)


def test_sincos_has_no_parameters_and_is_fixed(tiny_cfg):
    model = VisionTransformer(tiny_cfg.replace(posemb="sincos2d"))
    assert not any("pos" in n for n, _ in model.named_parameters())
    assert "pos_embed_fixed" not in model.state_dict()
    pe = model.position_embedding()
    assert pe.shape == (1, 65, 64) and torch.all(pe[0, 0] == 0)


def test_position_every_layer_variants_are_used_per_block(tiny_cfg):
    every = VisionTransformer(tiny_cfg.replace(posemb_where="every_layer"))
    assert every.pos_embed.shape == (2, 65, 64)
    shared = VisionTransformer(tiny_cfg.replace(posemb_where="every_layer_shared"))
    assert shared.pos_embed.shape == (1, 65, 64)
    # changing table 1 changes only what block 1 sees
    x = torch.randn(1, 3, 32, 32)
    before = every.forward_intermediates(x, [0, 1], output_fmt="dict")["intermediates"]
    with torch.no_grad():
        every.pos_embed[1].add_(1.0)
    after = every.forward_intermediates(x, [0, 1], output_fmt="dict")["intermediates"]
    torch.testing.assert_close(before[0], after[0])
    assert not torch.allclose(before[1], after[1])


def test_layernorm_eps_and_gelu_are_config_fields(tiny_cfg):
    model = VisionTransformer(tiny_cfg.replace(ln_eps=1e-12, gelu="tanh"))
    assert all(m.eps == 1e-12 for m in model.modules() if isinstance(m, torch.nn.LayerNorm))
    assert model.blocks[0].mlp.act.approximate == "tanh"
    exact = VisionTransformer(tiny_cfg)
    exact.load_state_dict(randomize_head(model).state_dict())
    x = torch.randn(2, 3, 32, 32)
    diff = (model(x) - exact(x)).abs().max()
    assert 0 < diff < 1e-2  # the two GELU flavours differ, but only slightly


def test_stochastic_depth_rates_and_determinism(tiny_cfg):
    model = randomize_head(VisionTransformer(tiny_cfg.replace(depth=5, drop_path=0.2)))
    assert [b.drop_path for b in model.blocks] == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])
    x = torch.randn(8, 3, 32, 32)
    model.train()
    assert not torch.allclose(model(x), model(x))
    model.eval()
    torch.testing.assert_close(model(x), model(x))


@pytest.mark.parametrize("class_token", [True, False])
def test_patch_dropout_keeps_a_sorted_random_subset_in_training_only(tiny_cfg, class_token):
    cfg = tiny_cfg.replace(patch_drop=0.75, class_token=class_token, pool="token" if class_token else "gap")
    model = VisionTransformer(cfg)
    prefix, n = cfg.num_prefix_tokens, cfg.num_patches  # 64 patches of an 8x8 grid
    x = torch.arange(4 * (prefix + n), dtype=torch.float32).view(4, prefix + n, 1).expand(-1, -1, 64)
    out = PatchDropout(prefix).train()(x, cfg.patch_drop)
    assert torch.equal(PatchDropout(prefix).eval()(x, cfg.patch_drop), x)  # evaluation never drops
    assert out.shape == (4, prefix + 16, 64)
    assert torch.equal(out[:, :prefix], x[:, :prefix])
    kept = out[:, prefix:, 0]
    for i in range(4):
        rows = kept[i] - i * (prefix + n) - prefix  # patch indices kept for image i
        assert torch.equal(rows, rows.sort().values) and rows.unique().numel() == 16
        assert 0 <= rows.min() and rows.max() < n
    assert not all(torch.equal(kept[0] - kept[0, 0], kept[i] - kept[i, 0]) for i in range(1, 4))

    images = torch.randn(3, 3, 32, 32)
    assert model.train().forward_features(images).shape == (3, prefix + 16, 64)
    plain = VisionTransformer(cfg.replace(patch_drop=0.0)).eval()
    plain.load_state_dict(model.state_dict())
    model.eval()
    assert model.forward_features(images).shape == (3, prefix + n, 64)
    torch.testing.assert_close(model(images), plain(images), rtol=0, atol=0)


def test_patch_dropout_needs_input_positions(tiny_cfg):
    for bad in (dict(posemb="relative"), dict(posemb="learn", posemb_where="every_layer")):
        with pytest.raises(vitkit.ConfigError, match="patch_drop"):
            tiny_cfg.replace(patch_drop=0.5, **bad)
    with pytest.raises(vitkit.ConfigError, match="patch_drop"):
        tiny_cfg.replace(patch_drop=1.0)


def test_gradient_checkpointing_gives_same_gradients(tiny_cfg):
    model = randomize_head(VisionTransformer(tiny_cfg)).train()
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([1, 2])
    F.cross_entropy(model(x), y).backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.set_grad_checkpointing(True)
    F.cross_entropy(model(x), y).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref[n], rtol=1e-5, atol=1e-6)


def test_forward_intermediates(tiny_cfg):
    model = VisionTransformer(tiny_cfg.replace(depth=4)).eval()
    x = torch.randn(2, 3, 32, 32)
    out = model.forward_intermediates(x, [1, -1], norm=True, output_fmt="dict", return_attention=True)
    assert out["indices"] == [1, 3] and out["grid"] == (8, 8)
    torch.testing.assert_close(out["intermediates"][1], out["features"])
    torch.testing.assert_close(out["features"], model.forward_features(x))
    assert len(out["attention"]) == 2
    last2 = model.forward_intermediates(x, 2, output_fmt="dict")
    assert last2["indices"] == [2, 3]
    early = model.forward_intermediates(x, [0], stop_early=True, output_fmt="dict")
    assert early["features"] is None and early["intermediates"][0].shape == (2, 65, 64)
    with pytest.raises(ValueError, match="out of range"):
        model.forward_intermediates(x, [7])


def test_input_errors_name_problem_and_fix(tiny_cfg):
    model = VisionTransformer(tiny_cfg)
    with pytest.raises(ValueError, match=r"got a 3-D tensor.*unsqueeze\(0\)"):
        model(torch.randn(3, 32, 32))
    with pytest.raises(ValueError, match=r"3-channel images, got 1 channels.*in_chans=1"):
        model(torch.randn(2, 1, 32, 32))
    with pytest.raises(ValueError, match=r"image 30x32 is not divisible by patch 4x4.*dynamic_img_pad=True"):
        model(torch.randn(2, 3, 30, 32))
    with pytest.raises(ValueError, match=r"built for 32x32 images, got 48x48.*dynamic_img_size=True"):
        model(torch.randn(2, 3, 48, 48))


def test_dynamic_img_pad(tiny_cfg):
    model = randomize_head(VisionTransformer(tiny_cfg.replace(img_size=30, dynamic_img_pad=True))).eval()
    assert model.config.grid_size == (8, 8)
    x = torch.randn(2, 3, 30, 30)
    padded = F.pad(x, (0, 2, 0, 2))
    ref = VisionTransformer(tiny_cfg).eval()
    ref.load_state_dict(model.state_dict())
    torch.testing.assert_close(model(x), ref(padded))


@pytest.mark.parametrize("posemb", ["learn", "learn2d", "relative", "sincos2d"])
def test_dynamic_img_size_equals_resized_model(tiny_cfg, posemb):
    model = randomize_head(VisionTransformer(tiny_cfg.replace(posemb=posemb, dynamic_img_size=True))).eval()
    if model.rel_pos is not None:
        for rel in model.rel_pos:
            torch.nn.init.normal_(rel.table, std=0.5)
    x = torch.randn(2, 3, 48, 40)
    dynamic = model(x)
    fixed = VisionTransformer(model.config)
    fixed.load_state_dict(model.state_dict())
    fixed.set_img_size((48, 40)).eval()
    assert fixed.config.grid_size == (12, 10)
    torch.testing.assert_close(dynamic, fixed(x), rtol=1e-5, atol=1e-5)


def test_set_img_size_matches_adapt_state_dict(tiny_cfg):
    model = VisionTransformer(tiny_cfg)
    big_cfg = tiny_cfg.replace(img_size=(48, 64))
    state, notes = vitkit.adapt_state_dict(model.state_dict(), big_cfg)
    assert notes == ["pos_embed resized 8x8 -> 12x16 (bilinear)"]
    loaded = VisionTransformer(big_cfg)
    loaded.load_state_dict(state)
    model.set_img_size((48, 64))
    torch.testing.assert_close(loaded.pos_embed, model.pos_embed)
    assert model.config.img_size == (48, 64)


def test_adapt_state_dict_head_and_pre_logits(tiny_cfg):
    src = randomize_head(VisionTransformer(tiny_cfg.replace(representation_size=32)))
    state, notes = vitkit.adapt_state_dict(src.state_dict(), tiny_cfg.replace(num_classes=3))
    assert "pre-logits layer dropped (model has none)" in notes
    assert state["head.weight"].shape == (3, 64) and state["head.weight"].abs().sum() == 0
    model = VisionTransformer(tiny_cfg.replace(num_classes=3))
    model.load_state_dict(state)  # strict: every key fits
    state0, _ = vitkit.adapt_state_dict(src.state_dict(), tiny_cfg.replace(num_classes=0))
    assert "head.weight" not in state0
    kept, _ = vitkit.adapt_state_dict(src.state_dict(), tiny_cfg.replace(representation_size=32))
    torch.testing.assert_close(kept["head.weight"], src.head.weight)


@pytest.mark.parametrize("posemb", ["learn", "learn2d", "sincos2d", "none"])
def test_distillation_token(tiny_cfg, posemb):
    """DeiT's distillation token: [cls, dist, patches]; logits = mean of the class head on token 0 and the
    distillation head on token 1 (the pair in distilled training); features = mean of the two tokens."""
    cfg = tiny_cfg.replace(distill_token=True, posemb=posemb)
    assert cfg.num_prefix_tokens == 2 and cfg.seq_len == 66
    model = randomize_head(VisionTransformer(cfg))
    torch.nn.init.normal_(model.head_dist.weight, std=0.1)
    assert model.head_dist.weight.shape == (10, 64) and not torch.equal(model.dist_token, model.cls_token)
    x = torch.randn(2, 3, 32, 32)
    tokens, _ = model.embed(x)
    torch.testing.assert_close(tokens[:, 1], model.dist_token[0].expand(2, -1))
    if posemb != "none":
        pe = model.position_embedding()
        assert pe.shape == (1, 66, 64)
        if posemb != "learn":  # fixed / 2D tables give the two tokens no position, as for the class token
            assert pe[0, :2].abs().sum() == 0
    tokens = model.eval().forward_features(x)
    logits = model(x)
    torch.testing.assert_close(logits, (model.head(tokens[:, 0]) + model.head_dist(tokens[:, 1])) / 2)
    torch.testing.assert_close(model.forward_head(tokens, pre_logits=True), (tokens[:, 0] + tokens[:, 1]) / 2)
    model.train()
    torch.testing.assert_close(model(x), logits)  # distilled_training off: the mean in training too
    model.distilled_training = True
    cls_logits, dist_logits = model(x)
    torch.testing.assert_close((cls_logits + dist_logits) / 2, logits)
    kept = model.forward_features(x, patch_drop=0.5)  # patch dropout keeps both tokens
    assert kept.shape == (2, 2 + 32, 64)
    assert "dist_token" in model.no_weight_decay()
    assert vitkit.models.cost.param_count(cfg) == model.num_params()
    one_head = VisionTransformer(cfg.replace(distill_head=False)).eval()  # HF's DeiTForImageClassification
    assert one_head.head_dist is None
    one_head.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("head_dist")})
    t1 = one_head.forward_features(x)
    torch.testing.assert_close(one_head(x), one_head.head(t1[:, 0]))
    assert vitkit.models.cost.param_count(one_head.config) == one_head.num_params()


def test_distillation_token_config_and_adaptation(tiny_cfg):
    for bad, match in (({"pool": "gap"}, "class token read-out"), ({"class_token": False, "pool": "gap"}, "class"),
                       ({"representation_size": 32}, "pre-logits"), ({"posemb": "relative"}, "relative")):
        with pytest.raises(vitkit.ConfigError, match=match):
            tiny_cfg.replace(distill_token=True, **bad)
    with pytest.raises(vitkit.ConfigError, match="distill_head=False only applies"):
        tiny_cfg.replace(distill_head=False)
    cfg = tiny_cfg.replace(distill_token=True)
    src = randomize_head(VisionTransformer(cfg))
    state, notes = vitkit.adapt_state_dict(src.state_dict(), cfg.replace(num_classes=3, img_size=48))
    assert state["pos_embed"].shape == (1, 2 + 144, 64)
    torch.testing.assert_close(state["pos_embed"][:, :2], src.pos_embed[:, :2])  # the token slots kept
    assert state["head_dist.weight"].shape == (3, 64) and state["head_dist.weight"].abs().sum() == 0
    assert "head_dist re-initialised to zeros: 10 -> 3 classes" in notes
    VisionTransformer(cfg.replace(num_classes=3, img_size=48)).load_state_dict(state)
    state, notes = vitkit.adapt_state_dict(src.state_dict(), cfg.replace(distill_head=False))
    assert "head_dist.weight" not in state and "head_dist dropped (the model has no distillation head)" in notes
    state, _ = vitkit.adapt_state_dict(src.state_dict(), cfg.replace(num_classes=0))
    assert not any(k.startswith(("head.", "head_dist.")) for k in state)
    model = VisionTransformer(cfg)
    model.set_img_size(48)
    assert model.pos_embed.shape == (1, 146, 64)


def attention_cfg(t):
    """A one-head, 4-wide ViT whose block attends over ``t`` tokens (a class token where t - 1 is a square)."""
    side = round((t - 1) ** 0.5)
    cls = side * side == t - 1
    side = side if cls else round(t ** 0.5)
    return vitkit.ViTConfig(img_size=2 * side, patch_size=2, in_chans=1, width=4, depth=1, num_heads=1, mlp_dim=8,
                            num_classes=2, class_token=cls, pool="token" if cls else "gap")


@pytest.mark.parametrize("t,mask_kind", [(17, None), (50, "float"), (9, "bool")])
def test_attention_paths_follow_the_plan_and_agree(t, mask_kind, monkeypatch):
    """``auto``: the planner times each path once for the model's shape and keeps the choice; a plan's path
    (declared or measured) is the one that runs, whatever surrounds the forward later (``use_backend`` decides
    the plans resolved inside it; a graph consumer gets the plan's path too); bf16 on a CPU without bf16
    GEMMs runs the path on operands widened to fp32. Values and gradients of the explicit path equal the
    fused kernel's."""
    from torch.utils.flop_counter import FlopCounterMode

    from vitkit.models import ops, planner
    from vitkit.models.kernel_plan import Measurements, resolve

    def qkv(tokens, dtype=torch.float32, grad=True):
        return [torch.zeros(1, 1, tokens, 4, dtype=dtype, requires_grad=grad) for _ in range(3)]

    def never(*a):
        raise AssertionError(f"{a[0]} timed again")
    bf16, f32 = torch.bfloat16, torch.float32
    cfg = attention_cfg(t)
    assert cfg.num_patches + cfg.num_prefix_tokens == t
    table, pinned = Measurements(), "gemm=aten,int8=x86"  # the attention choices only
    decided = planner.plan(cfg, f32, backend=pinned, measurements=table)  # auto: timed now, for this shape
    assert {decided.attention_for(f32, grad) for grad in (False, True)} <= {"fused", "explicit"}
    assert sorted(k.split(" width=")[0] for k in table.entries) == ["attention float32", "attention training float32"]
    assert all(f" tokens={t} " in k for k in table.entries)
    assert resolve(cfg, f32, backend=pinned, measurements=table, timer=never).attention == decided.attention  # kept
    calls = []
    real = ops.explicit_attention
    monkeypatch.setattr(ops, "explicit_attention", lambda *a: calls.append(1) or real(*a))
    ops.attention(*qkv(16, bf16), path="fused")
    assert not calls
    ops.attention(*qkv(16), path="explicit")
    assert calls == [1]
    with use_backend(attention="explicit"):  # a model built inside keeps the declared path after the block
        model = VisionTransformer(cfg).eval()
    assert model.kernel_plan.attention == {f"{d} {m}": "explicit" for d in ("float32", "bfloat16")
                                           for m in ("inference", "training") if d in model.kernel_plan.gemm}
    x = torch.randn(2, 1, *cfg.img_size)
    with torch.no_grad(), FlopCounterMode(display=False):  # under a graph consumer too
        model(x)
    assert calls == [1, 1]
    with use_backend(attention="fused"):  # a forward inside the block runs the plan bound before
        model(x)
    assert calls == [1, 1, 1]
    monkeypatch.setattr(ops, "cpu_has_native_bf16", lambda: False)  # bf16 on the fp32 units
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8, generator=g).to(bf16) for _ in range(3))
    assert ops.widen_bf16(q)
    widened = ops.attention(q, k, v, path="fused")  # the operands widened exactly, softmax in fp32, rounded after
    assert widened.dtype == bf16 and not calls[3:]
    assert torch.equal(widened, F.scaled_dot_product_attention(q.float(), k.float(), v.float()).to(bf16))
    assert ops.attention(*qkv(16, bf16), path="explicit").dtype == bf16 and calls == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="attention path 'flash'"):
        ops.attention(*qkv(16), path="flash")

    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, t, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = None
    if mask_kind == "float":
        mask = torch.randn(2, t, t, dtype=torch.float64)
    elif mask_kind == "bool":
        mask = torch.rand(t, t) > 0.3
        mask.fill_diagonal_(True)
    out = real(q, k, v, mask, 0.0)[0]
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref)
    for a, b in zip(torch.autograd.grad(out.square().sum(), (q, k, v)),
                    torch.autograd.grad(ref.square().sum(), (q, k, v))):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("tokens", [16, 197])  # the explicit path and the fused kernel
def test_attention_values_and_gradients_equal_a_per_head_reference(tokens):
    """Eq. 2's MSA written head by head from the qkv projection's [q | k | v] x heads x head-width columns:
    the module's output and every gradient (input, qkv and projection weights) agree in float64."""
    from vitkit.models.layers import Attention

    torch.manual_seed(0)
    width, heads = 48, 3
    dh = width // heads
    attn = Attention(width, heads).double()
    x = torch.randn(2, tokens, width, dtype=torch.float64, requires_grad=True)
    params = [x, attn.qkv.weight, attn.qkv.bias, attn.proj.weight, attn.proj.bias]

    def reference(x, wqkv, bqkv, wp, bp):
        qkv = x @ wqkv.T + bqkv
        outs = []
        for i in range(heads):
            q, k, v = (qkv[..., j * width + i * dh: j * width + (i + 1) * dh] for j in range(3))
            outs.append(torch.softmax(q @ k.transpose(-1, -2) / dh ** 0.5, dim=-1) @ v)
        return torch.cat(outs, dim=-1) @ wp.T + bp

    out, _ = attn(x)
    ref = reference(*params)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, params, g), torch.autograd.grad(ref, params, g)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("img_size,pad", [(32, False), (30, True)])
def test_patch_embedding_gemm_equals_the_convolution(tiny_cfg, img_size, pad):
    """The patch projection runs as one GEMM over flattened patches (training and inference paths): the
    same outputs and gradients as the stride-P convolution its weights describe (padded inputs too)."""
    cfg = tiny_cfg.replace(img_size=img_size, dynamic_img_pad=pad)
    emb = VisionTransformer(cfg).patch_embed.double()
    x = torch.randn(2, 3, img_size, img_size, dtype=torch.float64, requires_grad=True)
    out = emb(x)
    xp = F.pad(x, (0, (-img_size) % 4, 0, (-img_size) % 4))
    ref = F.conv2d(xp, emb.proj.weight, emb.proj.bias, stride=4)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(ref)
    grads = torch.autograd.grad(out, (x, emb.proj.weight, emb.proj.bias), g)
    refs = torch.autograd.grad(ref, (x, emb.proj.weight, emb.proj.bias), g)
    for a, b in zip(grads, refs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    with torch.inference_mode():
        torch.testing.assert_close(emb(x.detach()), ref.detach(), rtol=1e-12, atol=1e-12)


# --- the inference path equals the training path, for every config field ---------------------------
# Values for fields whose type alone does not give a valid alternative, and the companions a value needs
# (e.g. distill_head=False only exists with a distillation token). Every other field gets its alternative
# from its type: the other bool, every allowed string (read from the config's own error message), a
# scaled number.
FIELD_VALUES = {
    "img_size": [(32, 48)],
    "width": [96],
    "depth": [3],
    "num_heads": [2, 8],
    "mlp_dim": [80],
    "backbone_width": [64 + 32],
    "patch_size": [(4, 8), 8],
    "num_classes": [0, 3],
    "representation_size": [32],
    "backbone": ["resnet"],
    "backbone_layers": [(1, 1)],
    "ln_eps": [1e-12, 1e-3],
    "std_conv_eps": [1e-8],
    "gn_eps": [1e-5],
    "layer_scale": [0.5],
    "reg_tokens": [2],
    "posemb_antialias": [True],
}
COMPANIONS = {
    "class_token": dict(pool="gap"),
    "distill_head": dict(distill_token=True),
    "backbone": dict(backbone_layers=(1,), backbone_width=32, patch_size=1),
    "backbone_layers": dict(backbone="resnet", backbone_width=32, patch_size=1),
    "backbone_width": dict(backbone="resnet", backbone_layers=(1,), patch_size=1),
    "width": dict(num_heads=4),
    "std_conv_eps": dict(backbone="resnet", backbone_layers=(1,), backbone_width=32, patch_size=1),
    "std_conv_style": dict(backbone="resnet", backbone_layers=(1,), backbone_width=32, patch_size=1),
    "gn_eps": dict(backbone="resnet", backbone_layers=(1,), backbone_width=32, patch_size=1),
    "patch_drop": dict(posemb="learn"),
    "posemb_where": dict(posemb="learn"),
    "attention": dict(pool="gap", class_token=False),  # axial attention has no prefix tokens
    "reg_tokens": dict(posemb="learn"),
    "posemb_class_slot": dict(posemb="learn"),
    "posemb_antialias": dict(posemb="learn", posemb_resize="bicubic"),
}
SKIP_FIELDS = {"name"}  # a label, no effect on the function


def _allowed_strings(name):
    """The allowed values of a string field, from the config's own validation message."""
    import re

    try:
        vitkit.ViTConfig(**{name: "?"})
    except vitkit.ConfigError as err:
        m = re.search(r"is not one of (.*?)(;|$)", str(err))
        if m:
            return [v.strip() for v in m.group(1).split(",")]
    return []


def _field_cases():
    import dataclasses

    cases = []
    for f in dataclasses.fields(vitkit.ViTConfig):
        if f.name in SKIP_FIELDS:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if f.name in FIELD_VALUES:
            values = FIELD_VALUES[f.name]
        elif isinstance(default, bool):
            values = [not default]
        elif isinstance(default, str):
            values = [v for v in _allowed_strings(f.name) if v != default]
        elif isinstance(default, float):
            values = [0.25] if default == 0.0 else [default * 10]
        elif isinstance(default, int):
            values = [default * 2]
        else:
            values = []
        for v in values:
            cases.append(pytest.param({**COMPANIONS.get(f.name, {}), f.name: v}, id=f"{f.name}={v}"))
    return cases


def test_every_config_field_has_inference_cases():
    """A new ViTConfig field gets cases from its type; this fails if one gets none."""
    import dataclasses

    covered = {k for c in _field_cases() for k in c.values[0]}
    missing = {f.name for f in dataclasses.fields(vitkit.ViTConfig)} - covered - SKIP_FIELDS
    assert not missing, f"add values for {missing} to FIELD_VALUES"


@pytest.mark.parametrize("variant", _field_cases())
def test_inference_path_equals_training_path(tiny_cfg, variant):
    """``model.eval()`` under inference_mode (residual adds inside GEMMs, chunks, GELU in place, the patch
    GEMM, the chosen GEMM kernel) computes what the training path computes with autograd on, for a model
    with each config field changed: logits, features and intermediates, in float64 (differences only from
    summation order) and float32."""
    cfg = tiny_cfg.replace(**variant)
    model = randomize_head(VisionTransformer(cfg)).eval()
    with torch.no_grad():  # every parameter perturbed: zero biases, unit LayerNorms would hide mistakes
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p), alpha=0.5 if "rel_pos" in name or name.endswith("cls") else 0.05)
    size = cfg.img_size if not cfg.dynamic_img_pad else (cfg.img_size[0] - 2, cfg.img_size[1] - 1)
    if cfg.dynamic_img_pad:
        cfg = cfg.replace(img_size=size)
        model.config = cfg
    batch = 5
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
        model = model.to(dtype)
        x = torch.randn(batch, cfg.in_chans, *size, dtype=dtype, generator=torch.Generator().manual_seed(1))
        ref = model(x)  # autograd on: the training path
        ref_inter = model.forward_intermediates(x, norm=True, output_fmt="dict")
        assert ref.requires_grad
        with torch.inference_mode():
            out = model(x)
            inter = model.forward_intermediates(x, norm=True, output_fmt="dict")
        scale = ref.abs().max().item() + 1e-3
        torch.testing.assert_close(out, ref.detach(), rtol=tol, atol=tol * scale)
        for a, b in zip(inter["intermediates"], ref_inter["intermediates"]):
            torch.testing.assert_close(a, b.detach(), rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_explicit_attention_in_low_precision_is_the_fp32_softmax_rounded(dtype):
    """For bf16/fp16 q/k/v the explicit path's softmax accumulates in fp32 and writes the low precision: its
    weights are the fp32 softmax of the same logits rounded once, but for rare weights one rounding step
    apart; a softmax in the low precision itself (or a missing rounding) would miss by far more."""
    from vitkit.models.ops import explicit_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(4, 6, 197, 64, generator=g).to(dtype) for _ in range(3))
    out, w = explicit_attention(q, k, v)
    assert w.dtype == dtype and out.dtype == dtype
    logits = (q * 64 ** -0.5) @ k.transpose(-2, -1)
    ref = logits.float().softmax(-1)
    rounded = ref.to(dtype)
    step = torch.finfo(dtype).eps * ref.abs().clamp_min(torch.finfo(dtype).tiny)  # one rounding step at each weight
    off = (w != rounded)
    assert off.float().mean() < 1e-4
    assert ((w.float() - rounded.float()).abs() <= 1.01 * step).all()
    torch.testing.assert_close(w.float().sum(-1), torch.ones(4, 6, 197), atol=0.02, rtol=0)
    # a float mask promotes the logits to fp32: the weights still come back in q's dtype
    mask = torch.zeros(197, 197)
    mask[:, -5:] = float("-inf")
    out, w = explicit_attention(q, k, v, mask)
    assert w.dtype == dtype and (w[..., -5:] == 0).all()
