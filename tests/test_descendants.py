"""The ViT's descendants as config fields: DeiT III, DINOv2 (with registers), CLIP and SigLIP towers.
Against their libraries: tests/test_descendants_peers.py (peers environment)."""
import json

import pytest
import torch

import vitkit
from vitkit import ConfigError, VisionTransformer, ViTConfig, load_weights, save_weights
from vitkit.cli import main
from vitkit.models.cost import cost, param_count

FAMILY = ["deit3_small_patch16_224", "vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2",
          "vit_base_patch16_clip_224", "vit_base_patch16_clip_quickgelu_224", "vit_base_patch16_siglip_224",
          "facebook/dinov2-small", "facebook/dinov2-with-registers-small", "openai/clip-vit-base-patch16",
          "google/siglip-base-patch16-224"]
# timm's own parameter counts of its models (timm.create_model(name).num_params, timm 1.0.31)
TIMM_PARAMS = {"deit3_small_patch16_224": 22_059_496, "vit_small_patch14_reg4_dinov2": 22_057_344,
               "vit_small_patch14_dinov2": 22_056_192, "vit_base_patch16_clip_224": 86_568_424,
               "vit_base_patch16_clip_quickgelu_224": 86_193_152, "vit_base_patch16_siglip_224": 92_884_224}


SMALL = dict(width=64, num_heads=4, mlp_dim=128, depth=2)  # the sizes the names' weights are cut to here


def tiny(name, **kw):
    """A descendant cut to unit-test size: every part kept, 2 blocks of width 64 on 28 px."""
    patch = vitkit.parse_model_name(name)["patch_size"]
    return vitkit.create_model(name, **{**SMALL, "img_size": 2 * patch, **kw})


@pytest.mark.parametrize("name", FAMILY)
def test_cost_model_counts_every_parameter(name):
    with torch.device("meta"):
        model = vitkit.create_model(name)
    assert model.num_params() == param_count(model.config) == cost(model.config).params
    if name in TIMM_PARAMS:
        assert model.num_params() == TIMM_PARAMS[name]


def test_new_fields_cost_nothing_when_off():
    """The paper's models are built exactly as before: no new module, parameter or buffer."""
    model = vitkit.create_model("B/16", depth=1)
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    assert not [n for n in names if n.startswith(("reg_token", "norm_pre", "fc_norm", "attn_pool")) or ".ls" in n]
    assert model.norm_pre is None and model.fc_norm is None and model.attn_pool is None
    assert model.blocks[0].ls1 is None and isinstance(model.blocks[0].mlp.act, torch.nn.GELU)
    assert vitkit.create_model("B/16").num_params() == 86_567_656


def test_map_pooling_cost_matches_flop_counter():
    """The attention pool's multiply-adds as torch counts them (the difference from a GAP model; the pool's
    attention on the explicit path, whose matmuls the counter sees, by the model's plan)."""
    from torch.utils.flop_counter import FlopCounterMode

    def flops(cfg):
        model = VisionTransformer(cfg).eval()
        model.set_kernel_plan("attention=explicit")
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(torch.randn(1, 3, *cfg.img_size), return_attention=True)
        return counter.get_total_flops()

    gap = ViTConfig(img_size=32, patch_size=4, width=64, depth=1, num_heads=4, mlp_dim=128, num_classes=0,
                    class_token=False, pool="gap")
    mapped = gap.replace(pool="map")
    assert flops(mapped) - flops(gap) == 2 * cost(mapped).macs_breakdown["attn_pool"]


def test_list_models_and_names():
    dinos = vitkit.list_models("*dinov2*")
    assert "vit_small_patch14_dinov2" in dinos and "facebook/dinov2-small" in dinos
    assert all("dinov2" in n for n in dinos)
    cfg = vitkit.config.config_from_name("vit_base_patch16_clip_quickgelu_224")
    assert (cfg.gelu, cfg.ln_eps, cfg.norm_pre, cfg.patch_bias, cfg.num_classes) == ("quick", 1e-5, True, False, 512)
    cfg = vitkit.config.config_from_name("vit_small_patch14_reg4_dinov2")
    assert (cfg.img_size, cfg.patch_size, cfg.reg_tokens, cfg.layer_scale, cfg.posemb_class_slot) == \
        ((518, 518), (14, 14), 4, 1e-5, False)
    assert cfg.grid_size == (37, 37) and cfg.seq_len == 1369 + 5 and cfg.posemb_len == 1369


@pytest.mark.parametrize("bad,match", [
    (dict(reg_tokens=-1), "reg_tokens"), (dict(layer_scale=0.0), "layer_scale"),
    (dict(reg_tokens=2, posemb="relative"), "register tokens"), (dict(final_norm="post"), "final_norm"),
    (dict(gelu="quik"), "did you mean 'quick'"), (dict(pool="map", representation_size=8), "pool='map'")])
def test_bad_fields_are_one_clear_line(bad, match):
    with pytest.raises(ConfigError, match=match):
        ViTConfig(**bad)


def test_registers_and_class_slot_positions():
    """Registers sit after the class token with no position; without a class slot the class token gets none
    either; the pooled output ignores the registers."""
    model = tiny("vit_small_patch14_reg4_dinov2").eval()
    pe = model.position_embedding()
    assert pe.shape == (1, 1 + 4 + 4, 64) and not pe[0, :5].any() and torch.equal(pe[0, 5:], model.pos_embed[0])
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        tokens = model.forward_features(x)
        assert tokens.shape == (2, 9, 64)
        assert torch.equal(model.forward_head(tokens, pre_logits=True), tokens[:, 0])


def test_quick_gelu_and_layer_scale_are_in_the_function():
    model = tiny("vit_base_patch16_clip_quickgelu_224").eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        base = model.forward_features(x)
        assert model.blocks[0].ls1 is None  # CLIP has no layer scale
        model.blocks[0].mlp.act = torch.nn.GELU()
        assert (model.forward_features(x) - base).abs().max() > 1e-6
    dino = tiny("vit_small_patch14_dinov2", layer_scale=0.5)
    assert torch.all(dino.blocks[1].ls2.gamma == 0.5)


def test_timm_intermediates_and_feature_maps():
    model = tiny("vit_small_patch14_reg4_dinov2", img_size=56, depth=4).eval()
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        feats, inter = model.forward_intermediates(x, 2, output_fmt="NCHW", return_prefix_tokens=True)
        assert feats.shape == (2, 1 + 4 + 16, 64) and len(inter) == 2
        assert inter[0][0].shape == (2, 64, 4, 4) and inter[0][1].shape == (2, 5, 64)
        nlc = model.forward_intermediates(x, [-1], output_fmt="NLC", intermediates_only=True)
        assert torch.equal(nlc[0].transpose(1, 2).reshape(2, 64, 4, 4), inter[1][0])
        as_dict = model.forward_intermediates(x, [-1], output_fmt="dict")  # vitkit's dict, asked for by name
        assert torch.equal(as_dict["intermediates"][0][:, 5:], nlc[0])
        default = model.forward_intermediates(x, [-1])  # timm's default: NCHW maps, (final, [maps])
        assert torch.equal(default[1][0], inter[1][0]) and torch.equal(default[0], feats)
        maps = model.forward_feature_maps(x, scales=(4, 2, 1, 0.5))
    assert [tuple(m.shape[-2:]) for m in maps] == [(16, 16), (8, 8), (4, 4), (2, 2)]
    assert [(i["module"], i["reduction"]) for i in model.feature_info[2:]] == [("blocks.2", 14), ("blocks.3", 14)]
    assert model.feature_info[0] == {"module": "blocks.0", "num_chs": 64, "reduction": 14}
    assert len(model.feature_info) == 4
    with pytest.raises(ValueError, match="output_fmt"):
        model.forward_intermediates(x, output_fmt="NHWC")


@pytest.mark.parametrize("name", ["deit3_small_patch16_224", "vit_small_patch14_reg4_dinov2",
                                  "vit_base_patch16_clip_quickgelu_224", "vit_base_patch16_siglip_224"])
def test_timm_file_round_trip_needs_the_name_for_numerics(tmp_path, name):
    """A timm state dict cannot say QuickGELU or CLIP's eps: the name supplies them; vitkit's own folder
    keeps every field."""
    model = tiny(name).eval()
    save_weights(model, tmp_path / "w.safetensors", "timm")
    back = vitkit.create_model(name, weights=tmp_path / "w.safetensors", **SMALL)  # sizes beside the name, as timm
    assert back.config.replace(name=None) == model.config.replace(name=None)
    x = torch.randn(2, 3, *model.config.img_size)
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), rtol=0, atol=0)
    save_weights(model, tmp_path / "native", "vitkit")
    assert load_weights(tmp_path / "native").config == model.config


def test_name_and_weights_disagree_names_both(tmp_path):
    save_weights(tiny("vit_small_patch14_dinov2"), tmp_path / "plain.pth", "timm")
    with pytest.raises(ConfigError, match=r"reg_tokens=0.*'vit_small_patch14_reg4_dinov2' has .*reg_tokens=4"):
        vitkit.create_model("vit_small_patch14_reg4_dinov2", weights=tmp_path / "plain.pth", **SMALL)
    save_weights(tiny("vit_base_patch16_siglip_224"), tmp_path / "siglip.pth", "timm")
    with pytest.raises(ConfigError, match=r"class_token=False, pool='map'.*class_token=True, pool='token'"):
        vitkit.create_model("deit3_small_patch16_224", weights=tmp_path / "siglip.pth", **SMALL)
    # the architecture: a name (with the sizes beside it) that is not the weights' shape is refused, both shown
    with pytest.raises(ConfigError, match=r"are width 64, depth 2, MLP 128, patch 14x14, but "
                                          r"'vit_small_patch14_dinov2' is width 384, depth 12, MLP 1536, patch 14x14"):
        vitkit.create_model("vit_small_patch14_dinov2", weights=tmp_path / "plain.pth")
    with pytest.raises(ConfigError, match=r"depth 2, .* is width 64, depth 3,"):
        vitkit.create_model("vit_small_patch14_dinov2", weights=tmp_path / "plain.pth", **dict(SMALL, depth=3))


@pytest.mark.parametrize("to", ["torchvision", "npz"])
def test_paper_layouts_refuse_the_descendants_parts(tmp_path, to):
    with pytest.raises(ValueError, match="layer scale"):
        save_weights(tiny("deit3_small_patch16_224"), tmp_path / ("x.npz" if to == "npz" else "x.pth"), to)
    with pytest.raises(ValueError, match="no register tokens"):  # HF's CLIP tower has none
        save_weights(tiny("vit_base_patch16_clip_224", reg_tokens=2, num_classes=0), tmp_path / "clip", "hf")


def test_class_slot_folded_and_added_exactly():
    """A table with a class slot loads into a model without one (the slot folded into the class token) and
    back: the same function both ways."""
    from vitkit.models.adapt import adapt_state_dict
    with_slot = tiny("vit_small_patch14_dinov2").eval()
    with torch.no_grad():
        with_slot.pos_embed[:, 0].normal_()
    target = with_slot.config.replace(posemb_class_slot=False)
    state, notes = adapt_state_dict(with_slot.state_dict(), target, source_grid=with_slot.config.grid_size)
    without = VisionTransformer(target).eval()
    without.load_state_dict(state)
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(without(x), with_slot(x))
    assert any("folded" in n for n in notes)
    state, notes = adapt_state_dict(without.state_dict(), with_slot.config, source_grid=target.grid_size)
    again = VisionTransformer(with_slot.config).eval()
    again.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(again(x), with_slot(x))


def test_dinov2_resolution_change_uses_the_models_resize():
    """set_img_size and loading at another size resize the 37x37-style table the one way: the config's
    bicubic, antialiased for timm's names."""
    model = tiny("vit_small_patch14_dinov2", img_size=70)  # a 5x5 grid
    from vitkit.models.posemb import resize_pos_embed
    expect = resize_pos_embed(model.pos_embed.detach(), (5, 5), (2, 2), 1, "bicubic", True)
    model.set_img_size(28)
    torch.testing.assert_close(model.pos_embed.detach(), expect)


def test_info_names_the_differences(capsys):
    assert main(["info", "vit_small_patch14_reg4_dinov2", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["params"] == 22_057_344 and row["variant"]["reg_tokens"] == 4 and row["tokens"] == 1374
    assert main(["info", "vit_base_patch16_siglip_224"]) == 0
    out = capsys.readouterr().out
    assert "pool=map" in out and "attn_pool" in out


def test_analyze_a_headless_tower(tmp_path):
    """vitkit analyze on a DINOv2 with registers and on SigLIP (no class token: rollout reads the patches)."""
    from vitkit.data import find_idx_dataset
    try:
        find_idx_dataset()
    except FileNotFoundError:
        pytest.skip("Fashion-MNIST not installed (make data)")
    for name in ("vit_small_patch14_reg4_dinov2", "vit_base_patch16_siglip_224"):
        weights, out = tmp_path / f"{name}-weights", tmp_path / name  # a vitkit folder: it stores the heads
        save_weights(tiny(name, img_size=56 if "14" in name else 64), weights, "vitkit")
        assert main(["analyze", str(weights), "--out", str(out), "--data", "fashion-mnist", "--num-images", "8",
                     "--rollout-images", "2", "--filters", "4"]) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert summary and (out / "rollout.png").is_file()


@pytest.mark.slow
def test_dinov2_ten_shot_probe_on_fashion_mnist(tmp_path, capsys):
    """A DINOv2-small (random weights, two blocks, 28 px) as an HF Dinov2Model folder -> vitkit fewshot:
    the 10-shot linear probe of its pooled embeddings on Fashion-MNIST, end to end."""
    from vitkit.data import find_idx_dataset
    try:
        find_idx_dataset()
    except FileNotFoundError:
        pytest.skip("Fashion-MNIST not installed (make data)")
    model = vitkit.create_model("facebook/dinov2-small", depth=2, img_size=42)  # a 3x3 table, used at 2x2
    folder = save_weights(model, tmp_path / "dinov2", "hf")
    assert main(["fewshot", str(folder), "--img-size", "28", "--shots", "10", "--seeds", "2", "--test-limit", "1000",
                 "--no-cache", "--quiet", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    acc = report["results"][str(folder)]
    print(json.dumps(acc))
    top1 = acc["fewshot"][0]["mean"]
    assert 0.2 < top1 <= 1.0  # random features of 10 images a class: far above chance (0.1)


def test_dinov2_repository_files_are_read():
    """The DINOv2 repository's torch.hub checkpoints: timm's names but ``register_tokens``, a ``mask_token`` (dropped,
    noted) and a table with the class slot; the same function as the model they were made from."""
    from vitkit.checkpoints.formats import timm as timm_format
    model = tiny("facebook/dinov2-with-registers-small").eval()  # class slot in the table, 4 registers
    with torch.no_grad():
        model.reg_token.normal_()
    state = {("register_tokens" if k == "reg_token" else k): v for k, v in model.state_dict().items()}
    state["mask_token"] = torch.zeros(1, 64)
    ckpt = timm_format.read(state, num_heads=4)
    assert any("mask token" in n for n in ckpt.notes) and ckpt.config.reg_tokens == 4
    back = VisionTransformer(ckpt.config).eval()
    back.load_state_dict(ckpt.state)
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(back.forward_features(x), model.forward_features(x))


@pytest.mark.parametrize("name", ["vit_so400m_patch14_siglip_384", "google/siglip-so400m-patch14-384"])
def test_siglip_so400m_at_384_reads_27_whole_patches(name):
    """384 px in 14 px patches: built at 384 (as timm and transformers), 27 patches a side, the last 6 pixels of
    each side not read; other sizes that are no multiple are still refused without crop_remainder."""
    m = vitkit.create_model(name, **dict(SMALL, patch_size=14)).eval()
    assert m.config.img_size == (384, 384) and m.config.grid_size == (27, 27) and m.config.crop_remainder
    x = torch.randn(2, 3, 384, 384)
    y = x.clone()
    y[..., 378:, :] = 5.0  # the pixels past the last whole patch: not read
    y[..., :, 378:] = -5.0
    with torch.no_grad():
        torch.testing.assert_close(m(x), m(y), rtol=0, atol=0)
    assert param_count(vitkit.create_model(name, depth=1).config.replace(depth=27)) == 428_225_600  # timm's
    with pytest.raises(ConfigError, match="not divisible by patch 14x14.*crop_remainder=True"):
        vitkit.create_model("vit_so400m_patch14_siglip_224", img_size=384)
    with pytest.raises(ConfigError, match="crop_remainder=True .* a hybrid"):
        vitkit.create_model("R50+B/16", crop_remainder=True)


def test_no_descendant_name_reads_as_a_hybrid():
    # parse_model_name tries the hybrid patterns before the descendants' table: a name in both would be misread
    from vitkit.families import FAMILIES
    from vitkit.variants import hybrid_match, parse_model_name
    assert len(FAMILIES) >= 40 and hybrid_match("r50+b/16") and hybrid_match("vit_base_r50_s16_224")
    for name in FAMILIES:
        s = name.lower().removeprefix("google/").removeprefix("facebook/")
        assert hybrid_match(s) is None, name
        assert parse_model_name(name)["name"] == name
