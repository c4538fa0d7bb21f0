"""create_model with weights but no name builds what the weights are (never B/16); a name that contradicts
the weights is refused with both shapes; timm's create_model keyword arguments build the model timm builds
(peers: the same outputs as timm for the same weights)."""
import pytest
import torch

import vitkit
from _weights import randomize
from test_checkpoints_torch import rel_err
from vitkit import ConfigError, save_weights
from vitkit.aliases import from_timm
from vitkit.checkpoints.base import HeadsUnknown


def _timm_file(tmp_path, name, **kw):
    torch.manual_seed(0)
    model = randomize(vitkit.create_model(name, **kw), std=0.05).eval()
    return model, save_weights(model, tmp_path / f"{name.replace('/', '_')}.pth", "timm")


@pytest.mark.parametrize("name,heads", [("Ti/16", 3), ("S/16", 6)])
def test_weights_without_a_name_are_read_as_load_weights_reads_them(tmp_path, name, heads):
    model, path = _timm_file(tmp_path, name, depth=2)
    ours = vitkit.create_model(weights=path)
    assert ours.config.num_heads == heads and ours.config.depth == 2
    assert ours.config == vitkit.load_weights(path).config
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), model(x), rtol=0, atol=0)
    with pytest.raises(ConfigError, match=rf"are width {model.config.width}, depth 2, MLP {model.config.mlp_dim}, "
                                          r"patch 16x16, but 'B/16' is width 768, depth 12, MLP 3072, patch 16x16"):
        vitkit.create_model("B/16", weights=path)
    with pytest.raises(ConfigError, match=rf"depth 2, .* but '{name}' is .*depth 12"):
        vitkit.create_model(name, weights=path)  # the name's depth is 12: sizes beside it fix that
    assert vitkit.create_model(name, weights=path, depth=2).config.num_heads == heads
    with pytest.raises(ConfigError, match="patch 16x16, but '.*' is .*patch 32x32"):
        vitkit.create_model(name.replace("16", "32"), weights=path, depth=2)


def test_a_width_of_no_standard_size_needs_num_heads(tmp_path):
    model, path = _timm_file(tmp_path, "B/16", width=96, num_heads=2, mlp_dim=64, depth=1, img_size=32,
                             num_classes=5)
    with pytest.raises(HeadsUnknown, match="width 96 is not a standard size's .*pass num_heads="):
        vitkit.create_model(weights=path)
    x = torch.randn(2, 3, 32, 32)
    for ours in (vitkit.create_model(weights=path, num_heads=2),
                 vitkit.create_model("B/16", weights=path, width=96, num_heads=2, mlp_dim=64, depth=1)):
        assert ours.config.num_heads == 2
        with torch.no_grad():
            torch.testing.assert_close(ours(x), model(x), rtol=0, atol=0)
    # the name's heads where the file has none (12 heads of 8 channels: not the model, but what was asked for)
    named = vitkit.create_model("B/16", weights=path, width=96, mlp_dim=64, depth=1)
    assert named.config.num_heads == 12 and any("12 heads from the model name" in n for n in named.meta.notes)
    with pytest.raises(ConfigError, match="are width 96, .* but 'S/16' is width 384"):
        vitkit.create_model("S/16", weights=path, depth=1)


@pytest.mark.parametrize("to", ["timm", "torchvision", "hf"])
def test_only_create_model_without_a_name_refuses_to_guess_heads(tmp_path, to):
    """Width 128 (no standard size; 4 heads trained): reading, loading and converting go on with 64-dim heads
    (the tensors are the same whatever the head count), while create_model(weights=...) without a name, built
    to compute with, asks for num_heads and with it computes the trained model."""
    torch.manual_seed(0)
    model = randomize(vitkit.create_model("B/16", width=128, num_heads=4, mlp_dim=96, depth=1, img_size=32,
                                          num_classes=3), std=0.2).eval()  # sharp attention: heads matter
    path = save_weights(model, tmp_path / ("w" if to == "hf" else "w.pth"), to)
    raw = path
    if to == "hf":  # a raw HF state dict: no config.json beside it
        (path / "config.json").unlink()
        raw = path / "model.safetensors"
    ckpt = vitkit.read_checkpoint(raw)
    assert ckpt.config.num_heads == 2 and "num_heads" in ckpt.assumed
    loaded = vitkit.load_weights(raw)
    assert loaded.config.num_heads == 2 and any("num_heads=2 assumed" in n for n in loaded.meta.notes)
    out = vitkit.convert(raw, tmp_path / "w_timm.pth", "timm")
    back = vitkit.read_checkpoint(out)
    assert all(torch.equal(back.state[k], v) for k, v in model.state_dict().items())
    with pytest.raises(HeadsUnknown, match=r"width 128 is not a standard size's .*: pass num_heads="):
        vitkit.create_model(weights=raw)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(vitkit.create_model(weights=raw, num_heads=4)(x), model(x))
        assert rel_err(loaded(x), model(x)) > 0.02  # the 64-dim guess is another function: why create_model asks


def test_a_config_with_weights_is_the_target(tmp_path):
    model, path = _timm_file(tmp_path, "Ti/16", depth=2, img_size=32, num_classes=3)
    cfg = model.config
    ours = vitkit.create_model(cfg, weights=path)
    assert ours.config == cfg
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), model(x), rtol=0, atol=0)
    with pytest.raises(ConfigError, match="are width 192, depth 2, .* but the config is width 192, depth 3"):
        vitkit.create_model(cfg.replace(depth=3), weights=path)


def test_timm_arguments_are_vitkit_fields():
    assert from_timm(dict(drop_path_rate=0.1, init_values=1e-5, class_token=False, global_pool="avg")) == \
        dict(drop_path=0.1, layer_scale=1e-5, class_token=False, pool="gap", final_norm="pooled")
    assert from_timm(dict(global_pool="avg", fc_norm=False)) == dict(pool="gap", final_norm="tokens")
    assert from_timm(dict(global_pool="map", no_embed_class=True)) == dict(pool="map", posemb_class_slot=False)
    assert from_timm(dict(pos_drop_rate=0.1, proj_drop_rate=0.1, attn_drop_rate=0.2, drop_rate=0.3)) == \
        dict(dropout=0.1, attn_dropout=0.2, head_dropout=0.3)
    assert from_timm(dict(init_values=0)) == from_timm(dict(init_values=None)) == dict(layer_scale=None)
    assert from_timm(dict(embed_dim=96, mlp_ratio=2.0)) == dict(width=96, mlp_dim=192)
    assert from_timm(dict(mlp_ratio=2.0), width=384) == dict(mlp_dim=768)
    for kw, msg in ((dict(global_pool=""), "forward_features"), (dict(global_pool="avgmax"), "'token', 'avg', 'map'"),
                    (dict(proj_drop_rate=0.1), "the same value"), (dict(drop_path=0.1, drop_path_rate=0.2), "disagree"),
                    (dict(mlp_ratio=4.0), "needs the width")):
        with pytest.raises(ConfigError, match=msg):
            from_timm(kw)
    m = vitkit.create_model("vit_small_patch16_224", depth=1, img_size=32, drop_path_rate=0.1, global_pool="avg",
                            class_token=False, init_values=1e-5, mlp_ratio=2.0, drop_rate=0.25)
    c = m.config
    assert (c.drop_path, c.pool, c.final_norm, c.class_token, c.layer_scale, c.mlp_dim, c.head_dropout) == \
        (0.1, "gap", "pooled", False, 1e-5, 768, 0.25)
    with pytest.raises(ConfigError, match=r"head_dropout must be in \[0, 1\)"):
        vitkit.create_model("S/16", drop_rate=1.0)


def test_head_dropout_drops_the_features_the_head_reads_in_training_only():
    """timm's drop_rate: in training each pooled feature reaches the head zeroed or scaled by 1/(1-p); the
    features returned beside the logits are before the dropout; in eval mode nothing is dropped."""
    torch.manual_seed(0)
    m = randomize(vitkit.create_model("S/16", depth=1, img_size=32, drop_rate=0.5, num_classes=384))
    with torch.no_grad():
        m.head.weight.copy_(torch.eye(384))  # the head passes what it reads through
        m.head.bias.zero_()
        x = torch.randn(16, 3, 32, 32)
        out = m.train().forward_outputs(x)
        kept = out.logits != 0
        assert 0.4 < 1 - kept.float().mean() < 0.6
        torch.testing.assert_close(out.logits[kept], 2 * out.features[kept])
        out = m.eval().forward_outputs(x)
        torch.testing.assert_close(out.logits, out.features)


def test_num_classes_zero_gives_the_pooled_features():
    torch.manual_seed(0)
    m = randomize(vitkit.create_model("S/16", depth=1, img_size=32, global_pool="avg", num_classes=0)).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out, feats = m(x), m.forward_features(x)
        assert out.shape == (2, 384)
        torch.testing.assert_close(out, m.fc_norm(feats[:, 1:].mean(1)))  # fc_norm after the mean, as timm


# --- against timm (peers environment) -------------------------------------------------------------------
@pytest.mark.peers
@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "vit_small_patch16_224"])
def test_timm_state_dict_without_a_name_matches_timm(tmp_path, name):
    """The first-hour case: a timm state dict of Ti/16 or S/16, create_model(weights=FILE), no name: the
    heads come from the width (3, 6), the logits are timm's."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    ref = randomize(timm.create_model(name, pretrained=False), std=0.02).eval()
    torch.save(ref.state_dict(), tmp_path / "ref.pth")
    ours = vitkit.create_model(weights=tmp_path / "ref.pth")
    assert ours.config.num_heads == ref.blocks[0].attn.num_heads
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        err = rel_err(ours(x), ref(x))
    print(f"{name} without a name: logits {err:.1e}")
    assert err < 1e-5


TIMM_KWARGS = [
    dict(drop_path_rate=0.1, drop_rate=0.0, init_values=1e-5),
    dict(drop_rate=0.3, drop_path_rate=0.2, init_values=0),  # init_values=0: no LayerScale, as timm
    dict(drop_rate=0.3, global_pool="avg", num_classes=0),  # pooled features after fc_norm and head dropout
    dict(global_pool="avg"),  # timm: fc_norm on (the final norm after pooling)
    dict(global_pool="avg", fc_norm=False),
    dict(class_token=False, global_pool="avg"),
    dict(global_pool="map"),
    dict(num_classes=0),  # the pooled features
    dict(num_classes=0, global_pool="avg"),  # the pooled features after fc_norm
    dict(no_embed_class=True, reg_tokens=2, init_values=0.1),
    dict(embed_dim=96, num_heads=3, mlp_ratio=2.0, pos_drop_rate=0.1, proj_drop_rate=0.1, attn_drop_rate=0.1),
]


@pytest.mark.peers
@pytest.mark.parametrize("kw", TIMM_KWARGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_timm_arguments_build_timms_model(tmp_path, kw):
    """vitkit.create_model(name, **kw) is timm.create_model(name, **kw): timm's weights load strictly into
    it (the same parameters), the outputs in eval mode are the same, and so is the stochastic depth."""
    timm = pytest.importorskip("timm")
    name, size = "vit_small_patch16_224", dict(depth=2, img_size=64)
    torch.manual_seed(0)
    ref = randomize(timm.create_model(name, pretrained=False, **size, **kw), std=0.05).eval()
    torch.save(ref.state_dict(), tmp_path / "ref.pth")
    ours = vitkit.create_model(name, **size, **kw)
    assert ours.num_params() == sum(p.numel() for p in ref.parameters())
    vitkit.load_weights(tmp_path / "ref.pth", model=ours)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        out, want = ours.eval()(x), ref(x)
    assert out.shape == want.shape and rel_err(out, want) < 1e-5
    assert ours.config.drop_path == kw.get("drop_path_rate", 0.0)
    assert ours.config.dropout == kw.get("proj_drop_rate", 0.0) and ours.config.attn_dropout == \
        kw.get("attn_drop_rate", 0.0)
    # training: the same stochastic depth per block and head dropout as timm's modules
    assert [b.drop_path for b in ours.blocks] == pytest.approx([float(getattr(b.drop_path1, "drop_prob", 0.0))
                                                                for b in ref.blocks])
    assert ours.head_drop.p == ref.head_drop.p == kw.get("drop_rate", 0.0)
    if set(kw) <= {"drop_rate", "global_pool", "num_classes"}:  # head dropout the only random step: same draws
        ours.train(), ref.train()
        with torch.no_grad():
            torch.manual_seed(1)
            out = ours(x)
            torch.manual_seed(1)
            want = ref(x)
        assert rel_err(out, want) < 1e-5 and (kw.get("drop_rate", 0.0) == 0 or (out == 0).any())
