import pytest
import torch

import vitkit
from vitkit import ConfigError, ViTConfig, create_model, list_models, parse_model_name
from vitkit.models.cost import cost, param_count

B16 = dict(width=768, depth=12, mlp_dim=3072, num_heads=12, patch_size=16)


@pytest.mark.parametrize("name", ["B/16", "ViT-B/16", "vit-b16", "vit_b_16", "vit-b-16", "ViT-B_16",
                                  "vit_base_patch16_224", "google/vit-base-patch16-224", "base/16"])
def test_name_forms_parse_to_b16(name):
    fields = parse_model_name(name)
    for k, v in B16.items():
        assert fields[k] == v
    assert fields.get("img_size", 224) == 224


@pytest.mark.parametrize("name,fields", [
    ("Ti/16", dict(width=192, depth=12, mlp_dim=768, num_heads=3, patch_size=16)),
    ("vit_small_patch32_384", dict(width=384, num_heads=6, patch_size=32, img_size=384)),
    ("L/32", dict(width=1024, depth=24, mlp_dim=4096, num_heads=16, patch_size=32)),
    ("vit-h14", dict(width=1280, depth=32, mlp_dim=5120, num_heads=16, patch_size=14)),
    ("vit_large_patch16_384", dict(width=1024, patch_size=16, img_size=384)),
    ("S/8", dict(width=384, patch_size=8)),
    ("deit_small_patch16_224", dict(width=384, num_heads=6, patch_size=16, img_size=224, name="DeiT-S/16@224")),
    ("facebook/deit-base-distilled-patch16-384", dict(width=768, img_size=384, distill_token=True)),
])
def test_other_names(name, fields):
    parsed = parse_model_name(name)
    for k, v in fields.items():
        assert parsed[k] == v


@pytest.mark.parametrize("name,expected", [
    ("Ti/16", 5_717_416), ("S/16", 22_050_664), ("B/16", 86_567_656), ("B/32", 88_224_232),
    ("L/16", 304_326_632), ("H/14", 632_045_800),
    # DeiT's distilled models (timm: 5.91M / 87.34M): one more token and a second 1000-class head
    ("deit_tiny_distilled_patch16_224", 5_910_800), ("deit_base_distilled_patch16_224", 87_338_192)])
def test_reference_parameter_counts(name, expected):
    cfg = ViTConfig(**parse_model_name(name))
    assert param_count(cfg) == expected
    device = "cpu" if expected < 100_000_000 else "meta"  # count L and H without allocating them
    with torch.device(device):
        model = create_model(name)
    assert model.num_params() == expected


def test_b16_multiply_adds():
    c = cost(ViTConfig(**parse_model_name("B/16")))
    assert round(c.macs / 1e9, 2) == 17.56
    assert c.flops == 2 * c.macs
    assert c.tokens == 197


def test_cost_matches_flop_counter(tiny_cfg):
    from torch.utils.flop_counter import FlopCounterMode

    for cfg in (tiny_cfg, tiny_cfg.replace(representation_size=32, img_size=(32, 48))):
        model = vitkit.VisionTransformer(cfg).eval()
        for gemm in ("aten", "onednn"):  # the counter gets ATen's GEMMs whatever the plan says
            assert model.set_kernel_plan(f"gemm={gemm}").gemm_for(torch.float32) == gemm
            with FlopCounterMode(display=False) as counter, torch.no_grad():
                model(torch.randn(1, 3, *cfg.img_size), return_attention=True)  # explicit path: matmuls counted
            assert counter.get_total_flops() == 2 * cost(cfg).macs
        assert param_count(cfg) == model.num_params()


@pytest.mark.parametrize("overrides", [
    dict(posemb="learn2d"), dict(posemb="relative"), dict(posemb="relative", posemb_where="every_layer_shared"),
    dict(posemb="sincos2d"), dict(posemb="none"), dict(posemb_where="every_layer"),
    dict(class_token=False, pool="gap"), dict(qkv_bias=False), dict(representation_size=48),
    dict(num_classes=0)])
def test_param_count_formula_all_options(tiny_cfg, overrides):
    cfg = tiny_cfg.replace(**overrides)
    assert param_count(cfg) == vitkit.VisionTransformer(cfg).num_params()


def test_unknown_name_suggests_close_names():
    with pytest.raises(ConfigError, match=r"unknown model name 'B/17x'.*Did you mean 'B/16'"):
        parse_model_name("B/17x")
    with pytest.raises(ConfigError, match="Names look like"):
        create_model("resnet50")


@pytest.mark.parametrize("overrides,match", [
    (dict(width=100, num_heads=12), "width 100 is not divisible by num_heads 12"),
    (dict(posemb="sincos2d", width=66, num_heads=6), "divisible by 4"),
    (dict(img_size=225), r"image 225x225 is not divisible by patch 16x16.*dynamic_img_pad=True"),
    (dict(posemb="learnd"), r"posemb='learnd' is not one of none, learn, .*did you mean"),
    (dict(pool="token", class_token=False), "class_token=True or pool='gap'"),
    (dict(dropout=1.5), r"dropout must be in \[0, 1\)"),
    (dict(patch_size=0), "positive"),
])
def test_inconsistent_configs_are_refused(overrides, match):
    with pytest.raises(ConfigError, match=match):
        ViTConfig(**overrides)


def test_unknown_override_field():
    with pytest.raises(ConfigError, match="unknown config field 'depht'; did you mean 'depth'"):
        create_model("Ti/16", depht=3)


def test_config_roundtrip_and_overrides():
    cfg = vitkit.create_model("S/16", img_size=(96, 128), num_classes=7, posemb="sincos2d").config
    assert cfg.grid_size == (6, 8) and cfg.num_patches == 48 and cfg.seq_len == 49
    assert ViTConfig.from_dict(cfg.to_dict()) == cfg
    assert "B/16" in list_models() and "H/14" in list_models()


def test_register_model():
    vitkit.register_model("unit-test-vit", img_size=28, patch_size=4, in_chans=1, width=32, depth=1,
                          num_heads=2, mlp_dim=64, num_classes=10)
    model = create_model("unit-test-vit", depth=2)
    assert model.config.name == "unit-test-vit" and len(model.blocks) == 2
    assert model(torch.randn(3, 1, 28, 28)).shape == (3, 10)
    assert "unit-test-vit" in list_models()


@pytest.mark.parametrize("arch", ["S/16", "R50+B/16", "vit_base_r50_s16_384", "deit_tiny_distilled_patch16_224",
                                  "vit_small_patch14_dinov2", "google/siglip-base-patch16-224", None])
def test_model_section_resolves_as_the_name_and_the_base_do(arch):
    """A model section (a recipe's ``model``) gives the config its name gives with its fields on top, or the
    base config's with them on top; "auto" class / channel counts take the values given, else the name's."""
    from vitkit.config import config_from_name, section_config

    fields = {"num_classes": "auto", "in_chans": "auto", "drop_path": 0.1, "img_size": 224}
    got = section_config({"arch": arch, **fields}, num_classes=7, in_chans=1)
    want = (config_from_name(arch, drop_path=0.1, img_size=224, num_classes=7, in_chans=1) if arch
            else ViTConfig(drop_path=0.1, img_size=(224, 224), num_classes=7, in_chans=1))
    assert got == want and got.img_size == (224, 224) and got.num_classes == 7 and got.in_chans == 1
    named = section_config({"arch": arch}) if arch else ViTConfig()
    assert section_config({"arch": arch, "num_classes": "auto"}).num_classes == named.num_classes
    base = ViTConfig(width=96, depth=2, num_heads=4, mlp_dim=192, num_classes=3)
    on_base = section_config({"arch": arch, **fields}, num_classes=None, in_chans=None, base=base)
    assert on_base == base.replace(drop_path=0.1, img_size=224)  # the base's classes and channels kept
    with pytest.raises(ConfigError, match="drop_path"):
        section_config({"arch": arch, "drop_path": "lots"})
