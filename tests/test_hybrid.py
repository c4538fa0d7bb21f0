"""Hybrid ResNet + ViT (Section 3.1): BiT ResNet numerics, SAME padding, names, shapes, counts, cost."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import vitkit
from _cost import assert_cost_matches_flop_counter
from _weights import randomize, randomize_head
from vitkit import ConfigError, ViTConfig, create_model, parse_model_name
from vitkit.models.cost import param_count
from vitkit.models.resnet import HybridEmbed, ResNet, StdConv2d, pad_same, same_padding


@pytest.fixture
def tiny_hybrid(tiny_cfg):
    """Two short ResNet stages (stride 8) of width 32 feeding 1x1 patches of a 4x4 map into a tiny ViT."""
    return tiny_cfg.replace(backbone="resnet", backbone_layers=(1, 1), backbone_width=32, patch_size=1)


def test_r50_b16_parameter_count_is_the_papers():
    cfg = ViTConfig(**parse_model_name("R50+B/16"))
    assert param_count(cfg) == 98_659_112
    model = create_model("R50+B/16")
    assert model.num_params() == 98_659_112
    assert cfg.grid_size == (14, 14) and cfg.seq_len == 197 and cfg.pixel_patch_size == (16, 16)
    assert model.patch_embed.backbone.layers == (3, 4, 9) and model.patch_embed.proj.in_channels == 1024


@pytest.mark.parametrize("name,params,grid,layers", [
    ("R50+L/32", 328_994_856, (7, 7), (3, 4, 6, 3)), ("R26+B/32", 101_383_976, (7, 7), (2, 2, 2, 2)),
    ("R26+S/32", 36_431_912, (7, 7), (2, 2, 2, 2)), ("R50+B/32", None, (7, 7), (3, 4, 6, 3))])
def test_other_hybrids(name, params, grid, layers):
    cfg = ViTConfig(**parse_model_name(name))
    assert cfg.grid_size == grid and cfg.backbone_layers == layers and cfg.patch_size == (1, 1)
    with torch.device("meta"):
        model = create_model(name)
    assert model.num_params() == param_count(cfg)
    if params is not None:  # the counts of the same models in timm
        assert param_count(cfg) == params


@pytest.mark.parametrize("name,canonical", [
    ("R50+ViT-B_16", "R50+B/16"), ("r50x1+vit-b/16", "R50+B/16"), ("vit_base_r50_s16_384", "R50+B/16@384"),
    ("R50x2+B/32", "R50x2+B/32"), ("vit_small_r26_s32_224", "R26+S/32@224")])
def test_hybrid_name_forms(name, canonical):
    f = parse_model_name(name)
    assert f["name"] == canonical and f["backbone"] == "resnet"
    if "x2" in canonical:
        assert f["backbone_width"] == 128
    assert "R50+B/16" in vitkit.list_models() and "R50+L/32" in vitkit.list_models()


def test_bad_hybrids_are_explained():
    with pytest.raises(ConfigError, match="/16 .three stages. or /32"):
        parse_model_name("R50+B/8")
    with pytest.raises(ConfigError, match="ResNet depth 18"):
        parse_model_name("R18+B/16")
    with pytest.raises(ConfigError, match="multiple of 32"):
        ViTConfig(backbone="resnet", backbone_width=48)
    with pytest.raises(ConfigError, match="backbone='resnt'.*did you mean 'resnet'"):
        ViTConfig(backbone="resnt")
    with pytest.raises(ConfigError, match="feature map .stride 16. 14x14 is not divisible by patch 4x4"):
        ViTConfig(backbone="resnet", patch_size=4)


def test_same_padding_matches_tensorflow_rule():
    # TF: out = ceil(n / s), total pad = max((out - 1) * s + k - n, 0), the extra pixel at the end
    assert same_padding(224, 7, 2) == (2, 3)
    assert same_padding(112, 3, 2) == (0, 1)
    assert same_padding(56, 1, 2) == (0, 0)
    assert same_padding(7, 3, 2) == (1, 1)
    x = torch.randn(1, 2, 5, 6)
    y = pad_same(x, 3, 2, value=-1.0)
    assert y.shape[-2:] == (7, 7)  # 5 -> (1, 1), 6 -> (0, 1)
    assert torch.equal(y[..., 1:6, 0:6], x) and (y[..., -1] == -1).all() and (y[..., 0, :] == -1).all()


def test_max_pool_pads_with_minus_infinity():
    net = ResNet(1, (), 32)
    with torch.no_grad():
        net.conv_root.weight.normal_()
    x = torch.randn(1, 1, 12, 12)
    root = F.relu(net.gn_root(net.conv_root(x)))  # 6x6 map; SAME pool pads one row/column at the end
    # window (i, j) covers rows/cols 2i..2i+2, clipped at the end: the padding never wins a max
    manual = torch.stack([torch.stack([root[..., 2 * i:2 * i + 3, 2 * j:2 * j + 3].amax((-2, -1))
                                       for j in range(3)], -1) for i in range(3)], -2)
    assert torch.allclose(net.forward_root(x), manual)


@pytest.mark.parametrize("size", [(224, 224), (30, 46), (33, 17)])
def test_feature_map_size_is_ceil_of_stride(size):
    net = ResNet(3, (1, 1, 1), 32).eval()
    with torch.no_grad():
        f = net(torch.randn(1, 3, *size))
    assert f.shape[1:] == (512, -(-size[0] // 16), -(-size[1] // 16))
    assert ViTConfig(backbone="resnet", backbone_layers=(1, 1, 1), img_size=size, patch_size=1,
                     dynamic_img_pad=True).grid_size == tuple(f.shape[-2:])


def test_weight_standardisation_flavours():
    conv = StdConv2d(3, 8, 3, eps=1e-5, style="std")
    w = conv.weight.detach().numpy().transpose(2, 3, 1, 0)  # HWIO, as in the Flax kernel
    ref = (w - w.mean(axis=(0, 1, 2))) / (w.std(axis=(0, 1, 2)) + 1e-5)  # the authors' weight_standardize
    assert np.allclose(conv.standardized_weight().detach().numpy().transpose(2, 3, 1, 0), ref, atol=1e-6)
    tim = StdConv2d(3, 8, 3, eps=1e-8, style="var")  # timm: batch_norm over [1, O, I*k*k]
    ref = F.batch_norm(tim.weight.reshape(1, 8, -1), None, None, training=True, eps=1e-8).reshape_as(tim.weight)
    assert torch.allclose(tim.standardized_weight(), ref, atol=1e-6)
    with torch.no_grad():  # a kernel with a tiny spread: the two flavours disagree visibly, as they should
        conv.weight.mul_(1e-4)
        tim.weight.copy_(conv.weight)
    assert (conv.standardized_weight() - tim.standardized_weight()).abs().max() > 1e-2


def test_numerics_fields_reach_the_layers(tiny_hybrid):
    model = vitkit.VisionTransformer(tiny_hybrid.replace(std_conv_style="var", std_conv_eps=1e-8, gn_eps=1e-5))
    convs = [m for m in model.modules() if isinstance(m, StdConv2d)]
    gns = [m for m in model.modules() if isinstance(m, torch.nn.GroupNorm)]
    assert convs and all(c.style == "var" and c.eps == 1e-8 for c in convs)
    assert gns and all(g.eps == 1e-5 and g.num_groups == 32 for g in gns)
    default = vitkit.VisionTransformer(tiny_hybrid)
    assert all(m.eps == 1e-6 for m in default.modules() if isinstance(m, torch.nn.GroupNorm))


def test_unit_structure_and_keys(tiny_hybrid):
    model = vitkit.VisionTransformer(tiny_hybrid)
    keys = set(model.state_dict())
    assert {"patch_embed.backbone.conv_root.weight", "patch_embed.backbone.gn_root.weight",
            "patch_embed.backbone.stages.0.0.conv_proj.weight", "patch_embed.backbone.stages.1.0.gn_proj.bias",
            "patch_embed.backbone.stages.0.0.conv2.weight", "patch_embed.proj.weight", "patch_embed.proj.bias"} <= keys
    assert not any(k.endswith("conv1.bias") for k in keys)  # convolutions without bias
    unit = model.patch_embed.backbone.stages[1][0]
    assert unit.conv2.stride == (2, 2) and unit.conv_proj.stride == (2, 2) and unit.conv1.stride == (1, 1)
    assert (unit.gn3.weight == 0).all()  # zero-initialised last GroupNorm of every unit, as the authors


def test_hybrid_forward_shapes_and_gradients(tiny_hybrid):
    model = randomize_head(vitkit.VisionTransformer(tiny_hybrid))
    x = torch.randn(2, 3, 32, 32)
    out = model.forward_intermediates(x, output_fmt="dict", return_attention=True)
    assert out["grid"] == (4, 4) and out["features"].shape == (2, 17, 64)
    assert out["attention"][0].shape == (2, 4, 17, 17)
    logits = model(x)
    assert logits.shape == (2, 10)
    logits.square().sum().backward()
    g = model.patch_embed.backbone.conv_root.weight.grad
    assert g is not None and g.abs().sum() > 0


def test_root_only_and_larger_feature_patches(tiny_cfg):
    cfg = tiny_cfg.replace(backbone="resnet", backbone_layers=(), backbone_width=32, patch_size=2)
    model = vitkit.VisionTransformer(cfg)
    assert cfg.feature_stride == 4 and cfg.pixel_patch_size == (8, 8) and cfg.grid_size == (4, 4)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 10)
    assert model.num_params() == param_count(cfg)


def test_other_resolutions(tiny_hybrid):
    from vitkit.models.posemb import resize_pos_embed

    # random weights everywhere (zero head and zero gn3 would hide differences)
    model = randomize(vitkit.VisionTransformer(tiny_hybrid.replace(dynamic_img_size=True)).eval())
    x = torch.randn(2, 3, 64, 48)
    out = model.forward_intermediates(x, output_fmt="dict")
    assert out["grid"] == (8, 6)
    fixed = vitkit.VisionTransformer(tiny_hybrid).eval()
    fixed.load_state_dict(model.state_dict())
    table = fixed.pos_embed.detach().clone()
    fixed.set_img_size((64, 48))
    # the 4x4 table resized to the 8x6 grid of the stride-8 map (bilinear, class slot kept), and the same
    # function as the dynamic model's on-the-fly resize
    assert fixed.pos_embed.shape[1] == 49
    torch.testing.assert_close(fixed.pos_embed.detach(), resize_pos_embed(table, (4, 4), (8, 6), 1, "bilinear"))
    with torch.no_grad():
        want = model(x)
        assert want.std() > 1e-3
        torch.testing.assert_close(fixed(x), want, rtol=1e-5, atol=1e-6)


def test_cost_matches_flop_counter_and_parameters(tiny_hybrid):
    for cfg in (tiny_hybrid, tiny_hybrid.replace(backbone_layers=(2, 1, 1), img_size=(48, 32), in_chans=1)):
        assert_cost_matches_flop_counter(cfg)


def test_config_and_native_round_trip(tiny_hybrid, tmp_path):
    from vitkit.checkpoints import load_model, save_model

    cfg = tiny_hybrid.replace(std_conv_style="var", gn_eps=1e-5)
    assert ViTConfig.from_dict(cfg.to_dict()) == cfg and cfg.to_dict()["backbone_layers"] == [1, 1]
    model = vitkit.VisionTransformer(cfg).eval()
    # every weight random: the zero-initialised gn3 of each unit and the zero head would hide the units'
    # convolutions and everything before the head
    randomize(model)
    save_model(model, tmp_path / "m")
    again = load_model(tmp_path / "m").eval()
    x = torch.randn(2, 3, 32, 32)
    assert again.config == cfg
    assert model.state_dict().keys() == again.state_dict().keys()
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in model.state_dict().items())
    with torch.no_grad():
        want = model(x)
        assert want.std() > 1e-3 and torch.equal(want, again(x))


def test_hybrid_embed_rejects_indivisible_feature_maps():
    emb = HybridEmbed(3, 16, (2, 2), (), 32)
    with pytest.raises(ValueError, match="feature map is not divisible by patch 2x2"):
        emb(torch.randn(1, 3, 20, 20))  # 20 px -> 5x5 map
    emb.pad = True
    assert emb(torch.randn(1, 3, 20, 20)).shape == (1, 16, 3, 3)


# --- checkpoints: the authors' .npz and timm layouts, round trips -------------------------------------------
def released_hybrid_arrays(layers=(1, 2), width=32, dim=64, grid=2, classes=10, seed=0):
    """Arrays named and shaped as in the authors' hybrid files (R50+ViT-B_16.npz), scaled down."""
    import numpy as np

    from test_checkpoints_npz import released_arrays

    rng = np.random.default_rng(seed)
    r = lambda *s: rng.standard_normal(s, dtype=np.float32)  # noqa: E731
    a = released_arrays(width=dim, depth=1, heads=4, mlp=2 * dim, patch=1, grid=grid, classes=classes, seed=seed)
    a.update({"conv_root/kernel": r(7, 7, 3, width), "gn_root/scale": r(width), "gn_root/bias": r(width)})
    cin = width
    for s, n in enumerate(layers):
        mid = width * 2 ** s
        for u in range(n):
            p = f"block{s + 1}/unit{u + 1}/"
            shapes = {"conv1": (1, 1, cin if u == 0 else 4 * mid, mid), "conv2": (3, 3, mid, mid),
                      "conv3": (1, 1, mid, 4 * mid)}
            if u == 0:
                shapes["conv_proj"] = (1, 1, cin, 4 * mid)
            for name, shape in shapes.items():
                a[p + name + "/kernel"] = r(*shape)
                gn = name.replace("conv", "gn")
                a[p + gn + "/scale"], a[p + gn + "/bias"] = r(shape[-1]), r(shape[-1])
        cin = 4 * mid
    a["embedding/kernel"] = r(1, 1, cin, dim)
    return a


def test_authors_hybrid_npz_reads_and_round_trips(tmp_path):
    import numpy as np

    from test_checkpoints_npz import assert_byte_identical
    from vitkit.checkpoints import convert, load_weights, read_checkpoint

    arrays = released_hybrid_arrays()
    np.savez(tmp_path / "R_B.npz", **arrays)
    ck = read_checkpoint(tmp_path / "R_B.npz")
    c = ck.config
    assert (c.backbone, c.backbone_layers, c.backbone_width, c.in_chans) == ("resnet", (1, 2), 32, 3)
    assert c.img_size == (16, 16) and c.grid_size == (2, 2)  # 2x2 tokens of an 8x-strided map
    assert (c.std_conv_style, c.std_conv_eps, c.gn_eps) == ("std", 1e-5, 1e-6)  # the authors' Flax numerics
    s = ck.state
    assert torch.equal(s["patch_embed.backbone.conv_root.weight"],
                       torch.from_numpy(arrays["conv_root/kernel"]).permute(3, 2, 0, 1))
    assert torch.equal(s["patch_embed.backbone.stages.1.0.gn_proj.bias"],
                       torch.from_numpy(arrays["block2/unit1/gn_proj/bias"]))
    assert torch.equal(s["patch_embed.backbone.stages.1.1.conv2.weight"],
                       torch.from_numpy(arrays["block2/unit2/conv2/kernel"]).permute(3, 2, 0, 1))
    model = load_weights(tmp_path / "R_B.npz")
    assert model(torch.rand(1, 3, 16, 16)).shape == (1, 10)
    convert(tmp_path / "R_B.npz", tmp_path / "direct.npz", "npz")
    assert_byte_identical(tmp_path / "R_B.npz", tmp_path / "direct.npz")
    convert(tmp_path / "R_B.npz", tmp_path / "v", "vitkit")  # A -> B -> A is exact
    convert(tmp_path / "v", tmp_path / "back_v.npz", "npz")
    assert_byte_identical(tmp_path / "R_B.npz", tmp_path / "back_v.npz")
    with pytest.warns(UserWarning, match="timm computes the ResNet with .*'var'"):  # tensors exact, maths not
        convert(tmp_path / "R_B.npz", tmp_path / "t.pth", "timm")
    with pytest.warns(UserWarning, match="npz computes the ResNet with .*'std'"):
        convert(tmp_path / "t.pth", tmp_path / "back_t.npz", "npz", num_heads=4)  # timm files do not store heads
    assert_byte_identical(tmp_path / "R_B.npz", tmp_path / "back_t.npz")


def test_timm_hybrid_layout_round_trips(tiny_hybrid, tmp_path):
    from vitkit.checkpoints import convert, load_weights, read_checkpoint, save_weights
    from vitkit.checkpoints.files import read_tensors

    cfg = tiny_hybrid.replace(std_conv_style="var", std_conv_eps=1e-8, gn_eps=1e-5, backbone_layers=())
    model = vitkit.VisionTransformer(cfg.replace(patch_size=2)).eval()
    randomize(model)
    save_weights(model, tmp_path / "r.pth", "timm")
    keys = set(read_tensors(tmp_path / "r.pth")[1])
    assert {"patch_embed.backbone.conv.weight", "patch_embed.backbone.norm.bias"} <= keys  # timm's bare stem
    ck = read_checkpoint(tmp_path / "r.pth", num_heads=4)  # timm files do not store heads
    assert ck.format == "timm" and ck.config == model.config
    x = torch.rand(2, 3, 32, 32)
    assert torch.equal(load_weights(tmp_path / "r.pth", num_heads=4)(x), model(x))
    convert(tmp_path / "r.pth", tmp_path / "v", "vitkit", num_heads=4)
    convert(tmp_path / "v", tmp_path / "r2.safetensors", "timm", safetensors=True)
    again = read_checkpoint(tmp_path / "r2.safetensors")
    assert all(torch.equal(again.state[k], v) for k, v in ck.state.items()) and again.state.keys() == ck.state.keys()


def test_hybrids_refused_where_the_format_has_none(tiny_hybrid, tmp_path):
    from vitkit.checkpoints import save_weights

    model = vitkit.VisionTransformer(tiny_hybrid)
    for fmt in ("torchvision", "hf"):
        with pytest.raises(ValueError, match="hybrid ResNet backbone"):
            save_weights(model, tmp_path / fmt, fmt)


@pytest.mark.peers
def test_r50_b16_logits_match_timm(tmp_path):
    timm = pytest.importorskip("timm")
    from vitkit.checkpoints import load_weights, save_weights

    ref = timm.create_model("vit_base_r50_s16_224", num_classes=10).eval()
    with torch.no_grad():  # random init, with non-trivial GroupNorm/LayerNorm affines and head
        for name, p in ref.named_parameters():
            if "norm" in name or name.startswith("head"):
                p.normal_(0.5 if name.endswith("weight") else 0.0, 0.2)
    torch.save(ref.state_dict(), tmp_path / "timm.pth")
    model = load_weights(tmp_path / "timm.pth")
    assert model.config.backbone_layers == (3, 4, 9) and model.config.std_conv_style == "var"
    assert model.num_params() == sum(p.numel() for p in ref.parameters())
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        want, got = ref(x), model(x)
    assert (want - got).abs().max() < 1e-4 * want.abs().max()
    # vitkit -> timm file -> timm model: the same function
    save_weights(model, tmp_path / "back.pth", "timm")
    fresh = timm.create_model("vit_base_r50_s16_224", num_classes=10).eval()
    fresh.load_state_dict(torch.load(tmp_path / "back.pth", weights_only=True))
    with torch.no_grad():
        assert torch.equal(fresh(x), want)
    # our authors'-layout .npz, read by timm's own loader for the authors' files, gives the same weights
    import warnings

    from timm.models.vision_transformer import _load_weights
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # npz implies the authors' numerics; the tensors are what is compared
        save_weights(model, tmp_path / "R50+B_16.npz", "npz")
    other = timm.create_model("vit_base_r50_s16_224", num_classes=10)
    _load_weights(other, str(tmp_path / "R50+B_16.npz"))
    for (k, a), b in zip(ref.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), k


def test_analysis_measures_hybrids_in_pixels(tiny_hybrid):
    from vitkit.analysis import patch_distances
    from vitkit.analysis.distance import mean_attention_distance
    from vitkit.analysis.rollout import rollout_maps

    model = vitkit.VisionTransformer(tiny_hybrid).eval()
    d_model = tiny_hybrid.width
    with torch.no_grad():  # q = k = 0: every token attends uniformly to all 17, whatever the backbone gives
        for blk in model.blocks:
            blk.attn.qkv.weight[:2 * d_model] = 0
            blk.attn.qkv.bias[:2 * d_model] = 0
    x = torch.rand(2, 3, 32, 32)
    maps = rollout_maps(model, x)
    assert maps.shape == (2, 32, 32)  # the 4x4 token grid covers the whole image
    # ((U + I) / 2)^2 = (3/4) U + I / 4: the class token owes 3/4 / 17 to each patch, every pixel alike
    torch.testing.assert_close(maps, torch.full((2, 32, 32), 0.75 / 17), rtol=1e-5, atol=1e-7)
    d = mean_attention_distance(model, x)
    # a token of the stride-8 feature map is 8 px wide: the mean distance of a 4x4 grid of 8 px patches,
    # twice that of 4 px patches and eight times that of the 1x1 feature-map patches
    want = float(patch_distances((4, 4), (8, 8)).mean())
    assert d.shape == (2, 4) and want == pytest.approx(8 * float(patch_distances((4, 4), 1).mean()))
    torch.testing.assert_close(d, torch.full((2, 4), want), rtol=1e-5, atol=1e-5)


def test_hybrid_trains_with_the_engine_and_reloads_at_another_resolution(tmp_path):
    from _synthetic import write_npz
    from vitkit.checkpoints import load_weights
    from vitkit.train import load_recipe, train

    data = write_npz(tmp_path / "q.npz", n_train=144, n_test=32)  # 16 held out for validation
    recipe = load_recipe("fmnist-fast", {
        "name": "tiny-hybrid", "model": {"img_size": 16, "patch_size": 1, "backbone": "resnet", "backbone_layers": [1],
                                         "backbone_width": 32, "width": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64,
                                         "pool": "token", "class_token": True},
        "data.dataset": f"tensors:{data}", "data.mean": [0.2], "data.std": [0.3], "data.val_size": 16,
        "optim.batch_size": 32,
        "schedule.epochs": 1, "schedule.warmup_steps": 1, "train.threads": 1, "train.predictions": 0})
    res = train(recipe, tmp_path / "run", progress=False)
    assert res["steps"] == 4 and res["val_images"] == 16 and res["test_images"] == 32
    # the reported test accuracy is the exported hybrid's, as `vitkit eval` measures it
    from vitkit.train import evaluate_checkpoint
    assert res["test_top1"] == evaluate_checkpoint(tmp_path / "run" / "model", f"tensors:{data}")["top1"]
    model = load_weights(tmp_path / "run" / "model", img_size=32)  # 4x4 -> 8x8 tokens, positions resized
    assert model.config.backbone_layers == (1,) and model.config.in_chans == 1 and model.config.grid_size == (8, 8)
    assert model.pos_embed.shape[1] == 65 and model(torch.rand(2, 1, 32, 32)).shape == (2, 4)
