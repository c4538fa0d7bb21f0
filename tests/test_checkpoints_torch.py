"""torchvision and timm layouts: key names and shapes as DESIGN.md lists them, exact round trips through files,
and (in the peers environment) the same logits as the real torchvision / timm models."""
import warnings

import pytest
import torch
from safetensors.torch import load_file

import vitkit
from _weights import randomize
from vitkit.checkpoints import convert, load_weights, read_checkpoint, save_weights

D, M, P, C, DEPTH, HEADS, IMG = 64, 128, 4, 10, 2, 4, 32
S = 1 + (IMG // P) ** 2


def tiny(**kw):
    kw = {"img_size": IMG, "patch_size": P, "width": D, "depth": DEPTH, "num_heads": HEADS, "mlp_dim": M,
          "num_classes": C, **kw}
    model = vitkit.create_model("B/16", **kw).eval()
    randomize(model)
    return model


def torchvision_keys(pre_logits=None):
    """DESIGN.md's torchvision names with the shapes torchvision's VisionTransformer gives them."""
    k = {"conv_proj.weight": (D, 3, P, P), "conv_proj.bias": (D,), "class_token": (1, 1, D),
         "encoder.pos_embedding": (1, S, D), "encoder.ln.weight": (D,), "encoder.ln.bias": (D,)}
    for i in range(DEPTH):
        b = f"encoder.layers.encoder_layer_{i}."
        k.update({b + "ln_1.weight": (D,), b + "ln_1.bias": (D,), b + "ln_2.weight": (D,), b + "ln_2.bias": (D,),
                  b + "self_attention.in_proj_weight": (3 * D, D), b + "self_attention.in_proj_bias": (3 * D,),
                  b + "self_attention.out_proj.weight": (D, D), b + "self_attention.out_proj.bias": (D,),
                  b + "mlp.0.weight": (M, D), b + "mlp.0.bias": (M,), b + "mlp.3.weight": (D, M),
                  b + "mlp.3.bias": (D,)})
    if pre_logits:
        k.update({"heads.pre_logits.weight": (pre_logits, D), "heads.pre_logits.bias": (pre_logits,)})
    k.update({"heads.head.weight": (C, pre_logits or D), "heads.head.bias": (C,)})
    return k


def timm_keys():
    k = {"patch_embed.proj.weight": (D, 3, P, P), "patch_embed.proj.bias": (D,), "cls_token": (1, 1, D),
         "pos_embed": (1, S, D), "norm.weight": (D,), "norm.bias": (D,), "head.weight": (C, D), "head.bias": (C,)}
    for i in range(DEPTH):
        b = f"blocks.{i}."
        k.update({b + "norm1.weight": (D,), b + "norm1.bias": (D,), b + "norm2.weight": (D,), b + "norm2.bias": (D,),
                  b + "attn.qkv.weight": (3 * D, D), b + "attn.qkv.bias": (3 * D,), b + "attn.proj.weight": (D, D),
                  b + "attn.proj.bias": (D,), b + "mlp.fc1.weight": (M, D), b + "mlp.fc1.bias": (M,),
                  b + "mlp.fc2.weight": (D, M), b + "mlp.fc2.bias": (D,)})
    return k


def shapes(state):
    return {k: tuple(v.shape) for k, v in state.items()}


@pytest.mark.parametrize("pre_logits", [None, 48])
def test_torchvision_layout_names_shapes_and_round_trip(tmp_path, pre_logits):
    model = tiny(representation_size=pre_logits)
    save_weights(model, tmp_path / "tv.pth", "torchvision")
    written = torch.load(tmp_path / "tv.pth", weights_only=True)
    assert shapes(written) == torchvision_keys(pre_logits)
    loaded = load_weights(tmp_path / "tv.pth", num_heads=HEADS)
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    convert(tmp_path / "tv.pth", tmp_path / "timm.safetensors", "timm", safetensors=True)  # A -> timm -> A
    convert(tmp_path / "timm.safetensors", tmp_path / "back.pth", "torchvision")
    back = torch.load(tmp_path / "back.pth", weights_only=True)
    assert sorted(back) == sorted(written) and all(torch.equal(back[k], written[k]) for k in written)


def test_torchvision_old_mlp_names(tmp_path):
    model = tiny()
    save_weights(model, tmp_path / "tv.pth", "torchvision")
    state = torch.load(tmp_path / "tv.pth", weights_only=True)
    old = {k.replace("mlp.0.", "mlp.linear_1.").replace("mlp.3.", "mlp.linear_2."): v for k, v in state.items()}
    assert any("linear_1" in k for k in old)
    torch.save({"model": old, "epoch": 3}, tmp_path / "old.pth")  # wrapped like a training checkpoint
    loaded = load_weights(tmp_path / "old.pth", num_heads=HEADS)
    x = torch.randn(2, 3, IMG, IMG)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


def test_timm_layout_names_shapes_round_trip_and_no_class_slot(tmp_path):
    model = tiny()
    save_weights(model, tmp_path / "t.safetensors", "timm", safetensors=True)
    written = load_file(str(tmp_path / "t.safetensors"))
    assert shapes(written) == timm_keys()
    ck = read_checkpoint(tmp_path / "t.safetensors", num_heads=HEADS)
    assert ck.format == "timm" and ck.preprocessing["name"] == "timm" and not ck.notes
    # timm's no_embed_class=True: the table has no class slot; the class token gets no position
    state = dict(written, pos_embed=written["pos_embed"][:, 1:].clone())
    torch.save({"module." + k: v for k, v in state.items()}, tmp_path / "noembed.pth")  # DDP prefix too
    ck = read_checkpoint(tmp_path / "noembed.pth", num_heads=HEADS)
    assert ck.layout["posemb_class_slot"] is False and ck.config.img_size == (IMG, IMG)
    save_weights(ck, tmp_path / "again.pth", "timm")
    again = torch.load(tmp_path / "again.pth", weights_only=True)
    assert all(torch.equal(again[k], state[k]) for k in state) and sorted(again) == sorted(state)


def test_timm_gap_without_class_token(tmp_path):
    model = tiny(class_token=False, pool="gap")
    save_weights(model, tmp_path / "gap.pth", "timm")
    loaded = load_weights(tmp_path / "gap.pth", num_heads=HEADS)
    assert loaded.config.pool == "gap" and not loaded.config.class_token
    assert loaded.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    x = torch.randn(2, 3, IMG, IMG)
    with torch.no_grad():  # a read-out of token 0 instead of the patch mean would give other logits
        assert torch.equal(loaded.eval()(x), model(x))
        assert not torch.allclose(model.forward_features(x)[:, 0], model.forward_features(x).mean(1))
    with pytest.raises(ValueError, match="class token read-out"):
        save_weights(model, tmp_path / "gap_tv.pth", "torchvision")


def test_distilled_deit_layouts_round_trip_and_refusals(tmp_path):
    """timm's VisionTransformerDistilled names (dist_token, head_dist, a 2-slot prefix in pos_embed), the
    vitkit folder, and clear refusals where a layout has no distillation token."""
    model = tiny(distill_token=True)
    x = torch.randn(2, 3, IMG, IMG)
    with torch.no_grad():
        ref = model(x)
    save_weights(model, tmp_path / "d.safetensors", "timm", safetensors=True)
    written = load_file(str(tmp_path / "d.safetensors"))
    want = dict(timm_keys(), pos_embed=(1, S + 1, D), dist_token=(1, 1, D), **{"head_dist.weight": (C, D),
                                                                                 "head_dist.bias": (C,)})
    assert shapes(written) == want
    for path in (tmp_path / "d.safetensors", save_weights(model, tmp_path / "native", "vitkit")):
        loaded = load_weights(path, num_heads=HEADS)
        assert loaded.config.distill_token and loaded.config.distill_head
        with torch.no_grad():
            assert torch.equal(loaded(x), ref)
    # a distilled table without token slots (no_embed_class style): two zero slots are added
    ck = read_checkpoint(tmp_path / "d.safetensors", num_heads=HEADS)
    state = dict(written, pos_embed=written["pos_embed"][:, 2:].clone())
    torch.save(state, tmp_path / "noembed.pth")
    ck = read_checkpoint(tmp_path / "noembed.pth", num_heads=HEADS)
    assert ck.state["pos_embed"].shape == (1, S + 1, D) and ck.state["pos_embed"][:, :2].abs().sum() == 0
    save_weights(ck, tmp_path / "again.pth", "timm")
    again = torch.load(tmp_path / "again.pth", weights_only=True)
    assert all(torch.equal(again[k], state[k]) for k in state) and sorted(again) == sorted(state)
    for fmt, match in (("torchvision", "no distillation token"), ("npz", "no distillation token")):
        with pytest.raises(ValueError, match=match):
            save_weights(model, tmp_path / f"x.{fmt}", fmt)
    one_head = tiny(distill_token=True, distill_head=False)
    with pytest.raises(ValueError, match="distill_head=False"):
        save_weights(one_head, tmp_path / "one.pth", "timm")


def test_numerics_warning_names_the_difference(tmp_path):
    model = tiny(gelu="tanh")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        save_weights(model, tmp_path / "tv.pth", "torchvision")
    assert any("tanh GELU" in str(w.message) for w in caught)


# --- the real libraries (peers environment) -------------------------------------------
def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def randomize_eval(module, std=0.05):
    torch.manual_seed(0)
    return randomize(module, std).eval()


@pytest.mark.peers
@pytest.mark.parametrize("pre_logits", [None, 48])
def test_torchvision_logits_both_ways(tmp_path, pre_logits):
    tvm = pytest.importorskip("torchvision.models")
    ref = randomize_eval(tvm.VisionTransformer(image_size=IMG, patch_size=P, num_layers=DEPTH, num_heads=HEADS,
                                               hidden_dim=D, mlp_dim=M, num_classes=C, representation_size=pre_logits))
    torch.save(ref.state_dict(), tmp_path / "ref.pth")
    ours = load_weights(tmp_path / "ref.pth", num_heads=HEADS)
    x = torch.randn(3, 3, IMG, IMG)
    with torch.no_grad():
        err_in = rel_err(ours(x), ref(x))
        back = tvm.VisionTransformer(image_size=IMG, patch_size=P, num_layers=DEPTH, num_heads=HEADS, hidden_dim=D,
                                     mlp_dim=M, num_classes=C, representation_size=pre_logits).eval()
        save_weights(ours, tmp_path / "ours.pth", "torchvision")
        back.load_state_dict(torch.load(tmp_path / "ours.pth", weights_only=True), strict=True)
        err_out = rel_err(back(x), ref(x))
    print(f"torchvision tiny (pre_logits={pre_logits}): rel err in {err_in:.2e}, out {err_out:.2e}")
    assert err_in < 1e-5 and err_out < 1e-5


@pytest.mark.peers
def test_torchvision_training_gradients_equal(tmp_path):
    """Every gradient equals torchvision's for the same weights, batch and loss (float64, pre-logits layer
    included), after the weights' own key map: torchvision's gradients are saved as if they were weights."""
    tvm = pytest.importorskip("torchvision.models")
    kw = dict(image_size=IMG, patch_size=P, num_layers=DEPTH, num_heads=HEADS, hidden_dim=D, mlp_dim=M,
              num_classes=C, representation_size=48)
    ref = randomize_eval(tvm.VisionTransformer(**kw)).double().train()
    torch.save(ref.state_dict(), tmp_path / "ref.pth")
    ours = load_weights(tmp_path / "ref.pth", num_heads=HEADS).double().train()
    torch.manual_seed(0)
    x, y = torch.randn(4, 3, IMG, IMG, dtype=torch.float64), torch.randint(0, C, (4,))
    for model in (ours, ref):
        torch.nn.functional.cross_entropy(model(x), y).backward()
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.grad)
    torch.save(ref.state_dict(), tmp_path / "grads.pth")
    grads = read_checkpoint(tmp_path / "grads.pth", num_heads=HEADS).state
    mine = dict(ours.named_parameters())
    assert set(grads) == set(mine)
    for name, p in mine.items():
        err = rel_err(p.grad, grads[name].to(p.grad.dtype))
        assert err < 1e-10, f"{name}: relative error {err:.2e}"


@pytest.mark.peers
def test_torchvision_vit_b_16_logits(tmp_path):
    tvm = pytest.importorskip("torchvision.models")
    ref = randomize_eval(tvm.vit_b_16(), std=0.02)
    torch.save(ref.state_dict(), tmp_path / "vit_b_16.pth")
    ours = load_weights(tmp_path / "vit_b_16.pth")
    assert ours.config.num_heads == 12 and ours.meta.labels[281] == "tabby"
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        err = rel_err(ours(x), ref(x))
    print(f"torchvision vit_b_16: rel err {err:.2e}")
    assert err < 1e-5


@pytest.mark.peers
@pytest.mark.parametrize("kind", ["token", "no_embed_class", "gap"])
def test_timm_logits_both_ways(tmp_path, kind):
    timm = pytest.importorskip("timm")
    from timm.models.vision_transformer import VisionTransformer as TimmViT
    kw = dict(img_size=IMG, patch_size=P, embed_dim=D, depth=DEPTH, num_heads=HEADS, mlp_ratio=M / D, num_classes=C)
    if kind == "no_embed_class":
        kw["no_embed_class"] = True
    if kind == "gap":
        kw.update(class_token=False, global_pool="avg", fc_norm=False)
    ref = randomize_eval(TimmViT(**kw))
    torch.save(ref.state_dict(), tmp_path / "ref.pth")
    ours = load_weights(tmp_path / "ref.pth", num_heads=HEADS)
    x = torch.randn(3, 3, IMG, IMG)
    back = TimmViT(**kw).eval()
    save_weights(ours, tmp_path / "ours.safetensors", "timm", safetensors=True)
    back.load_state_dict(load_file(str(tmp_path / "ours.safetensors")), strict=True)
    with torch.no_grad():
        err_in, err_out = rel_err(ours(x), ref(x)), rel_err(back(x), ref(x))
    print(f"timm {kind}: rel err in {err_in:.2e}, out {err_out:.2e} (timm {timm.__version__})")
    assert err_in < 1e-5 and err_out < 1e-5


@pytest.mark.peers
@pytest.mark.parametrize("kind", ["token", "gap"])
def test_timm_training_gradients_equal(tmp_path, kind):
    """Training equivalence, not only logits: the same weights, batch and loss give every parameter the same
    gradient in vitkit and timm (float64, both in train mode; the parameter names coincide)."""
    pytest.importorskip("timm")
    from timm.models.vision_transformer import VisionTransformer as TimmViT
    kw = dict(img_size=IMG, patch_size=P, embed_dim=D, depth=DEPTH, num_heads=HEADS, mlp_ratio=M / D, num_classes=C)
    if kind == "gap":
        kw.update(class_token=False, global_pool="avg", fc_norm=False)
    ref = randomize_eval(TimmViT(**kw))
    torch.save(ref.state_dict(), tmp_path / "ref.pth")
    ours = load_weights(tmp_path / "ref.pth", num_heads=HEADS).double().train()
    ref = ref.double().train()
    torch.manual_seed(0)
    x, y = torch.randn(4, 3, IMG, IMG, dtype=torch.float64), torch.randint(0, C, (4,))
    for model in (ours, ref):
        torch.nn.functional.cross_entropy(model(x), y).backward()
    theirs = dict(ref.named_parameters())
    mine = dict(ours.named_parameters())
    assert set(mine) == set(theirs)
    for name, p in mine.items():
        torch.testing.assert_close(p.grad, theirs[name].grad, rtol=1e-9, atol=1e-12, msg=name)


@pytest.mark.peers
def test_timm_deit_distilled_logits_both_ways(tmp_path):
    """timm's VisionTransformerDistilled (DeiT): dist_token, head_dist, logits = mean of the two heads in
    eval, the pair in distilled training; and back into timm with the same logits."""
    pytest.importorskip("timm")
    from timm.models.deit import VisionTransformerDistilled
    kw = dict(img_size=IMG, patch_size=P, embed_dim=D, depth=DEPTH, num_heads=HEADS, mlp_ratio=M / D, num_classes=C)
    ref = randomize_eval(VisionTransformerDistilled(**kw))
    torch.save(ref.state_dict(), tmp_path / "deit.pth")
    ours = load_weights(tmp_path / "deit.pth", num_heads=HEADS)
    assert ours.config.distill_token and ours.config.distill_head and ours.config.seq_len == S + 1
    x = torch.randn(3, 3, IMG, IMG)
    back = VisionTransformerDistilled(**kw).eval()
    save_weights(ours, tmp_path / "ours.pth", "timm")
    back.load_state_dict(torch.load(tmp_path / "ours.pth", weights_only=True), strict=True)
    with torch.no_grad():
        err_in, err_out = rel_err(ours(x), ref(x)), rel_err(back(x), ref(x))
        feats = rel_err(ours.forward_head(ours.forward_features(x), pre_logits=True),
                        ref.forward_head(ref.forward_features(x), pre_logits=True))
        from vitkit.train.distill import TwoHeads  # the two heads apart, as distillation trains them

        ref.train().set_distilled_training(True)  # no dropout: train mode only returns the pair
        pairs = [rel_err(a, b) for a, b in zip(TwoHeads(ours.train())(x), ref(x))]
    print(f"timm DeiT distilled: rel err in {err_in:.2e}, out {err_out:.2e}, features {feats:.2e}, pair {pairs}")
    assert max(err_in, err_out, feats, *pairs) < 1e-5


@pytest.mark.peers
def test_timm_deit_tiny_distilled_patch16_224_by_name(tmp_path):
    timm = pytest.importorskip("timm")
    ref = randomize_eval(timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False), std=0.02)
    torch.save(ref.state_dict(), tmp_path / "deit.pth")
    ours = load_weights(tmp_path / "deit.pth")
    named = vitkit.create_model("deit_tiny_distilled_patch16_224").config
    assert ours.config.replace(name=None) == named.replace(name=None)  # heads (3) guessed from the width
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        err = rel_err(ours(x), ref(x))
    print(f"timm deit_tiny_distilled_patch16_224: rel err {err:.2e}")
    assert err < 1e-5


@pytest.mark.peers
def test_timm_vit_base_patch16_224_logits(tmp_path):
    timm = pytest.importorskip("timm")
    ref = randomize_eval(timm.create_model("vit_base_patch16_224", pretrained=False), std=0.02)
    torch.save(ref.state_dict(), tmp_path / "vit_base.pth")
    ours = load_weights(tmp_path / "vit_base.pth")
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        err = rel_err(ours(x), ref(x))
    print(f"timm vit_base_patch16_224: rel err {err:.2e}")
    assert err < 1e-5


@pytest.mark.peers
def test_presets_equal_torchvision_and_timm_transforms():
    tvm = pytest.importorskip("torchvision.models")
    timm = pytest.importorskip("timm")
    skimage_data = pytest.importorskip("skimage.data")
    from PIL import Image

    from vitkit.data.preprocess import get_preset
    img = Image.fromarray(skimage_data.chelsea())  # 451 x 300, not square
    for weights, name in ((tvm.ViT_B_16_Weights.IMAGENET1K_V1, "torchvision"),
                          (tvm.ViT_L_16_Weights.IMAGENET1K_V1, "torchvision"),
                          (tvm.ViT_B_16_Weights.IMAGENET1K_SWAG_E2E_V1, "torchvision-swag")):
        theirs = weights.transforms()(img)
        ours = get_preset(name, theirs.shape[-1])
        if weights is tvm.ViT_L_16_Weights.IMAGENET1K_V1:  # resize 242 for crop 224
            import dataclasses
            ours = dataclasses.replace(ours, resize=242)
        torch.testing.assert_close(ours(img), theirs, rtol=0, atol=1e-6)
    model = timm.create_model("vit_base_patch16_224.augreg2_in21k_ft_in1k", pretrained=False)
    cfg = timm.data.resolve_data_config({}, model=model)
    theirs = timm.data.create_transform(**cfg)(img)
    torch.testing.assert_close(get_preset("timm")(img), theirs, rtol=0, atol=1e-6)


# --- timm Hub folders (config.json + model.safetensors) ------------------------------------------------
def _photos():
    skimage_data = pytest.importorskip("skimage.data")
    from PIL import Image
    return [Image.fromarray(skimage_data.chelsea()), Image.fromarray(skimage_data.astronaut()).resize((301, 263))]


@pytest.mark.parametrize("kind", ["token", "gap", "distilled"])
def test_timm_folder_round_trip(tmp_path, kind):
    """--to timm with a folder name writes timm's Hub layout; reading it back gives the same tensors, the
    heads (from model_args, which the weights cannot show), the read-out, labels and preprocessing."""
    import json

    from vitkit.data.preprocess import get_preset
    kw = {"gap": dict(class_token=False, pool="gap"), "distilled": dict(distill_token=True)}.get(kind, {})
    model = tiny(**kw)
    model.meta.labels = [f"class {i}" for i in range(C)]
    model.meta.preprocessing = get_preset("timm", IMG).to_dict()
    out = save_weights(model, tmp_path / "folder", "timm")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((out / "config.json").read_text())
    assert config["model_args"]["num_heads"] == HEADS and config["label_names"] == model.meta.labels
    assert config["architecture"] == ("deit_base_distilled_patch16_224" if kind == "distilled" else
                                      "vit_base_patch16_224")  # model_args carry the real sizes
    assert config["global_pool"] == ("avg" if kind == "gap" else "token")
    assert config["pretrained_cfg"]["crop_pct"] == 0.9 and config["pretrained_cfg"]["crop_mode"] == "center"
    back = load_weights(out)
    assert back.config.replace(name=None) == model.config.replace(name=None)
    assert back.meta.labels == model.meta.labels and back.meta.format == "timm"
    for k, v in model.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    for img in _photos():
        assert torch.equal(get_preset(back.meta.preprocessing)(img), get_preset("timm", IMG)(img))
    # a weights-file name still writes a file
    assert save_weights(model, tmp_path / "w.safetensors", "timm", safetensors=True).is_file()


def test_timm_folder_config_variants_and_refusals(tmp_path):
    """Older single-dict config.json files; squash crops; timm extensions and pools that are not the
    paper's ViT are refused with the reason; hybrids and pre-logits layers cannot be written as folders."""
    import json

    from vitkit.data.preprocess import get_preset
    out = save_weights(tiny(), tmp_path / "f", "timm")
    cfg_file = out / "config.json"
    config = json.loads(cfg_file.read_text())
    legacy = {"architecture": "vit_base_patch16_224", "num_classes": C, "num_features": D,
              "input_size": [3, IMG, IMG], "interpolation": "bilinear", "crop_pct": 0.8, "crop_mode": "squash",
              "mean": [0.5] * 3, "std": [0.5] * 3, "labels": [f"n{i:08d}" for i in range(C)]}
    cfg_file.write_text(json.dumps(legacy))
    m = load_weights(out, num_heads=HEADS)
    pre = get_preset(m.meta.preprocessing)
    assert (pre.resize_mode, pre.resize, pre.crop_rounding) == ("square", 40, "round")  # floor(32 / 0.8)
    assert m.meta.labels == legacy["labels"]
    # the descendants' parts are read (the weights must then have them); other extensions are refused
    for extra, match in (({"reg_tokens": 4}, "missing: reg_token"), ({"init_values": 1e-5}, "missing: .*ls1.gamma"),
                         ({"global_pool": "map"}, "missing: attn_pool"), ({"pos_embed": "rope"}, "not the paper"),
                         ({"qk_norm": True}, "not the paper's ViT"), ({"global_pool": "avgmax"}, "avgmax")):
        cfg_file.write_text(json.dumps({**config, "model_args": {**config["model_args"], **extra}}))
        with pytest.raises(ValueError, match=match):
            load_weights(out)
    gray = tiny(in_chans=1)
    preset = {"name": "fmnist", "size": [IMG, IMG], "mean": [0.286], "std": [0.353]}
    gray.meta.preprocessing = get_preset(preset).to_dict()
    out = save_weights(gray, tmp_path / "gray", "timm")
    pc = json.loads((out / "config.json").read_text())["pretrained_cfg"]
    assert pc["input_size"] == [1, IMG, IMG] and pc["mean"] == [0.286] and pc["crop_mode"] == "squash"
    assert get_preset(load_weights(out).meta.preprocessing).mean == (0.286,) * 3
    with pytest.raises(ValueError, match="pre-logits"):
        save_weights(tiny(representation_size=D), tmp_path / "pl", "timm")
    hybrid = vitkit.create_model("R50+ViT-B/16", img_size=IMG, width=D, depth=1, num_heads=HEADS, mlp_dim=M,
                                 backbone_layers=[1], num_classes=C)
    with pytest.raises(ValueError, match="hybrid"):
        save_weights(hybrid, tmp_path / "hy", "timm")


@pytest.mark.peers
@pytest.mark.parametrize("case", ["vit_tiny", "gap_squash", "deit_distilled", "no_embed_class_160"])
def test_timm_folder_both_ways(tmp_path, case):
    """timm's save_for_hf folder -> vitkit: the same logits, class names and pixels as timm's own
    create_transform(resolve_data_config(...)) on non-square photos; vitkit -> folder -> timm's
    create_model('local-dir:...', pretrained=True): the same logits and pixels again."""
    timm = pytest.importorskip("timm")
    from timm.data import create_transform, resolve_data_config
    from timm.models import save_for_hf

    from vitkit.data.preprocess import get_preset
    name, kw, data = {
        "vit_tiny": ("vit_tiny_patch16_224", dict(num_classes=5), None),
        "gap_squash": ("vit_small_patch16_224", dict(num_classes=4, global_pool="avg", class_token=False,
                                                     fc_norm=False, depth=2),
                       {"crop_mode": "squash", "crop_pct": 0.95, "interpolation": "bilinear"}),
        "deit_distilled": ("deit_tiny_distilled_patch16_224", dict(num_classes=3, depth=2), {"crop_pct": 1.0}),
        "no_embed_class_160": ("vit_base_patch16_224", dict(num_classes=3, depth=1, img_size=160,
                                                            no_embed_class=True), None)}[case]
    ref = randomize_eval(timm.create_model(name, pretrained=False, **kw))
    names = [f"class {i}" for i in range(kw["num_classes"])]
    save_for_hf(ref, tmp_path / "theirs", safe_serialization=True, data_config=data,
                model_config={"label_names": names})

    def pixels_err(timm_folder_model, preset):
        transform = create_transform(**resolve_data_config(model=timm_folder_model))
        return max((transform(img) - get_preset(preset)(img)).abs().max().item() for img in _photos())

    ours = load_weights(tmp_path / "theirs")
    assert ours.meta.labels == names and not ours.meta.notes
    x = torch.randn(2, 3, *ours.config.img_size)
    theirs_cfg = timm.create_model(f"local-dir:{tmp_path / 'theirs'}", pretrained=False)
    out = save_weights(ours, tmp_path / "ours", "timm")
    back = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    with torch.no_grad():
        err_in, err_out = rel_err(ours(x), ref(x)), rel_err(back(x), ref(x))
    pix_in, pix_out = pixels_err(theirs_cfg, ours.meta.preprocessing), pixels_err(back, ours.meta.preprocessing)
    print(f"timm folder {case}: logits rel err in {err_in:.2e}, out {err_out:.2e}; pixels {pix_in}, {pix_out}")
    assert max(err_in, err_out) < 1e-5 and pix_in == pix_out == 0.0


@pytest.mark.peers
@pytest.mark.parametrize("preset", ["timm", "torchvision", "hf"])
def test_timm_folder_presets_are_what_timm_runs(tmp_path, preset):
    """vitkit's presets written into pretrained_cfg make timm compute the same pixels (shorter side + crop
    as crop_mode 'center', a squash as 'squash' with crop_pct 1)."""
    timm = pytest.importorskip("timm")
    from timm.data import create_transform, resolve_data_config

    from vitkit.data.preprocess import get_preset
    model = vitkit.create_model("Ti/16", depth=1, num_classes=3)
    model.meta.preprocessing = get_preset(preset, 224).to_dict()
    out = save_weights(model, tmp_path / "f", "timm")
    transform = create_transform(**resolve_data_config(model=timm.create_model(f"local-dir:{out}")))
    for img in _photos():
        assert (transform(img) - get_preset(preset, 224)(img)).abs().max() == 0.0
