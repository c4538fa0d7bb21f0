"""DeiT III, DINOv2 (with registers), CLIP and SigLIP image towers against the libraries people download
them from (peers environment): timm's models built by name with random weights, and transformers'
Dinov2Model, Dinov2WithRegistersModel, CLIPVisionModel(WithProjection), CLIPModel and SiglipVisionModel.
vitkit's logits / features equal theirs to a relative 1e-5 in fp32, and what vitkit writes back loads
strictly into the same class with the same outputs. Each model keeps its structure (every part,
the numerics of its name); the sizes are cut (fewer blocks, smaller images) to keep the set fast."""
import pytest
import torch
from safetensors.torch import load_file

import vitkit
from test_checkpoints_torch import randomize, rel_err  # the same helpers as the paper-ViT peer tests
from vitkit import load_weights, save_weights

pytestmark = pytest.mark.peers


# name, timm keyword arguments (fewer blocks, a smaller image where 518 px is not the point)
TIMM = [
    ("deit3_small_patch16_224", dict(depth=2, img_size=64)),
    ("vit_small_patch14_reg4_dinov2", dict(depth=2, img_size=56)),
    ("vit_small_patch14_dinov2", dict(depth=1)),  # at 518 px: the 37x37 grid
    ("vit_base_patch16_clip_224", dict(depth=2, img_size=64)),
    ("vit_base_patch16_clip_quickgelu_224", dict(depth=2, img_size=64)),
    ("vit_base_patch16_siglip_224", dict(depth=2, img_size=64)),
]


@pytest.mark.parametrize("name,kw", TIMM, ids=[n for n, _ in TIMM])
def test_timm_models_both_ways(tmp_path, name, kw):
    """timm state dict -> vitkit.create_model(NAME, weights=FILE) -> same logits (or features) and
    forward_features; -> save_weights(.., "timm") -> timm loads it strictly, same outputs."""
    timm = pytest.importorskip("timm")
    ref = randomize(timm.create_model(name, pretrained=False, **kw))
    torch.save(ref.state_dict(), tmp_path / "ref.pth")
    ours = vitkit.create_model(name, weights=tmp_path / "ref.pth", **kw)  # timm's sizes beside the name, as there
    assert ours.num_params() == sum(p.numel() for p in ref.parameters())
    assert not [n for n in ours.meta.notes if "assumed" in n and "class names" not in n]  # the name said them
    x = torch.randn(2, 3, *ours.config.img_size)
    out = save_weights(ours, tmp_path / "ours.safetensors", "timm")
    back = timm.create_model(name, pretrained=False, **kw).eval()
    back.load_state_dict(load_file(out), strict=True)
    with torch.no_grad():
        ref_out, ref_feats = ref(x), ref.forward_features(x)
        errs = (rel_err(ours(x), ref_out), rel_err(ours.forward_features(x), ref_feats), rel_err(back(x), ref_out))
    print(f"{name}: logits {errs[0]:.1e}, features {errs[1]:.1e}, written back {errs[2]:.1e}")
    assert max(errs) < 1e-5


def test_timm_dinov2_resolution_change_and_intermediates(tmp_path):
    """DINOv2's 37x37 table resized for 224 px as timm resizes it (bicubic, antialiased: dynamic_img_size),
    and timm's forward_intermediates return shapes (NCHW maps, prefix tokens split off)."""
    timm = pytest.importorskip("timm")
    ref = randomize(timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, depth=2,
                                      dynamic_img_size=True))
    torch.save(ref.state_dict(), tmp_path / "ref.pth")
    ours = vitkit.create_model("vit_small_patch14_reg4_dinov2", weights=tmp_path / "ref.pth", depth=2, img_size=224)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        err = rel_err(ours(x), ref(x))
        theirs = ref.forward_intermediates(x, indices=[0, 1], output_fmt="NCHW", return_prefix_tokens=True)
        mine = ours.forward_intermediates(x, indices=[0, 1], output_fmt="NCHW", return_prefix_tokens=True)
    assert err < 1e-5
    assert rel_err(mine[0], theirs[0]) < 1e-5
    for (a, pa), (b, pb) in zip(mine[1], theirs[1]):
        assert a.shape == b.shape == (2, 384, 16, 16) and pa.shape == pb.shape == (2, 5, 384)
        assert rel_err(a, b) < 1e-5 and rel_err(pa, pb) < 1e-5


def test_name_and_weights_disagree_names_both(tmp_path):
    timm = pytest.importorskip("timm")
    ref = randomize(timm.create_model("vit_small_patch14_dinov2", pretrained=False, depth=1, img_size=56))
    torch.save(ref.state_dict(), tmp_path / "plain.pth")
    with pytest.raises(vitkit.ConfigError, match=r"reg_tokens=0.*reg_tokens=4"):
        vitkit.create_model("vit_small_patch14_reg4_dinov2", weights=tmp_path / "plain.pth", depth=1, img_size=56)


# --- Hugging Face -----------------------------------------------------------------------------------
def _hf_cases():
    t = pytest.importorskip("transformers")
    kw = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, patch_size=14,
              image_size=56)
    return {
        "Dinov2Model": t.Dinov2Config(**kw),
        "Dinov2WithRegistersModel": t.Dinov2WithRegistersConfig(**kw),
        "CLIPVisionModel": t.CLIPVisionConfig(**kw),
        "CLIPVisionModelWithProjection": t.CLIPVisionConfig(**kw, projection_dim=32),
        "SiglipVisionModel": t.SiglipVisionConfig(**kw),
    }


@pytest.mark.parametrize("cls", ["Dinov2Model", "Dinov2WithRegistersModel", "CLIPVisionModel",
                                 "CLIPVisionModelWithProjection", "SiglipVisionModel"])
@pytest.mark.parametrize("form", ["folder", "state_dict"])
def test_hf_towers_both_ways(tmp_path, cls, form):
    """save_pretrained folder (or its bare model.safetensors, config from the name) -> vitkit: the same last
    hidden state and pooled output (CLIP's projection: image_embeds); -> save_weights(.., "hf") ->
    from_pretrained loads it (strictly: no missing or unexpected key), the same outputs."""
    t = pytest.importorskip("transformers")
    config = _hf_cases()[cls]
    ref = randomize(getattr(t, cls)(config))
    ref.save_pretrained(tmp_path / "ref")
    if form == "folder":
        ours = load_weights(tmp_path / "ref")
    else:  # a bare state dict: the numerics come from the model's Hub name
        name = {"Dinov2Model": "facebook/dinov2-small",
                "Dinov2WithRegistersModel": "facebook/dinov2-with-registers-small",
                "CLIPVisionModel": "openai/clip-vit-base-patch16",
                "CLIPVisionModelWithProjection": "openai/clip-vit-base-patch16",
                "SiglipVisionModel": "google/siglip-base-patch16-224"}[cls]
        mlp = 256 if cls.startswith("Dinov2") else 128  # Dinov2Config: mlp_ratio 4, not intermediate_size
        ours = vitkit.create_model(name, weights=tmp_path / "ref" / "model.safetensors", width=64, depth=2,
                                   mlp_dim=mlp, num_heads=4, patch_size=14)
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        o = ref(pixel_values=x)
        feats = ours.forward_features(x)
        if cls.endswith("Projection"):
            errs = [rel_err(ours(x), o.image_embeds)]
        else:
            errs = [rel_err(feats, o.last_hidden_state), rel_err(ours.forward_head(feats, pre_logits=True),
                                                                 o.pooler_output)]
        out = save_weights(ours, tmp_path / "back", "hf")
        back, info = getattr(t, cls).from_pretrained(out, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        ob = back.eval()(pixel_values=x)
        errs.append(rel_err(ob.last_hidden_state, o.last_hidden_state))
    print(f"{cls} ({form}): " + ", ".join(f"{e:.1e}" for e in errs))
    assert max(errs) < 1e-5


@pytest.mark.parametrize("cls", ["CLIPModel", "SiglipModel"])
def test_hf_combined_models_give_their_image_tower(tmp_path, cls):
    """A downloaded CLIPModel / SiglipModel folder: vitkit reads the image tower (CLIP's projection as the
    head) and drops the text tower with a note; the image embeddings are theirs."""
    t = pytest.importorskip("transformers")
    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    vision = dict(small, patch_size=14, image_size=56)
    if cls == "CLIPModel":
        config = t.CLIPConfig(text_config=small, vision_config=vision, projection_dim=32)
    else:
        config = t.SiglipConfig(text_config=small, vision_config=vision)
    ref = randomize(getattr(t, cls)(config))
    ref.save_pretrained(tmp_path / "ref")
    ours = load_weights(tmp_path / "ref")
    assert any("text tower" in n for n in ours.meta.notes)
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        theirs = ref.get_image_features(pixel_values=x)
        theirs = getattr(theirs, "pooler_output", theirs)
        mine = ours(x)
    assert rel_err(mine, theirs) < 1e-5


@pytest.mark.parametrize("name", ["vit_small_patch14_reg4_dinov2", "vit_base_patch16_clip_quickgelu_224",
                                  "vit_base_patch16_siglip_224", "deit3_small_patch16_224"])
def test_timm_hub_folders_both_ways(tmp_path, name):
    """timm's Hub folder (save_for_hf: config.json names the architecture) -> vitkit without a name: the
    architecture's numerics (QuickGELU, eps, no_embed_class) are read from the folder; vitkit -> folder ->
    timm.create_model('local-dir:...', pretrained=True): the same outputs."""
    timm = pytest.importorskip("timm")
    from timm.models import save_for_hf
    ref = randomize(timm.create_model(name, pretrained=False, depth=2, img_size=56 if "14" in name else 64))
    save_for_hf(ref, tmp_path / "theirs", safe_serialization=True)
    ours = load_weights(tmp_path / "theirs")
    x = torch.randn(2, 3, *ours.config.img_size)
    out = save_weights(ours, tmp_path / "ours", "timm")
    back = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    with torch.no_grad():
        errs = rel_err(ours(x), ref(x)), rel_err(back(x), ref(x))
    print(f"{name} timm folder: in {errs[0]:.1e}, out {errs[1]:.1e}")
    assert max(errs) < 1e-5


@pytest.mark.parametrize("quick", [False, True])
def test_open_clip_visual_tower_both_ways(tmp_path, quick):
    """An OpenCLIP model's state dict (image and text towers) -> vitkit under a CLIP name: the image
    embedding (ln_post, then the projection) equals encode_image; vitkit -> open_clip layout -> the tower
    loads it strictly, same embedding."""
    open_clip = pytest.importorskip("open_clip")
    cfg = dict(embed_dim=32, quick_gelu=quick,
               vision_cfg=dict(image_size=56, patch_size=14, width=64, layers=2, head_width=16, mlp_ratio=2.0),
               text_cfg=dict(context_length=8, vocab_size=64, width=32, heads=2, layers=1))
    ref = randomize(open_clip.CLIP(**cfg))
    torch.save(ref.state_dict(), tmp_path / "clip.pth")
    name = "vit_base_patch16_clip_quickgelu_224" if quick else "vit_base_patch16_clip_224"
    ours = vitkit.create_model(name, weights=tmp_path / "clip.pth", width=64, depth=2, mlp_dim=128, num_heads=4,
                               patch_size=14)
    assert ours.config.gelu == ("quick" if quick else "exact") and ours.config.num_classes == 32
    assert any("text tower" in n for n in ours.meta.notes)
    x = torch.randn(2, 3, 56, 56)
    out = save_weights(ours, tmp_path / "visual.safetensors", "open_clip")
    back = randomize(open_clip.CLIP(**cfg))
    back.visual.load_state_dict(load_file(out), strict=True)
    with torch.no_grad():
        theirs = ref.encode_image(x)
        errs = rel_err(ours(x), theirs), rel_err(back.encode_image(x), theirs)
    print(f"OpenCLIP (quick_gelu={quick}): in {errs[0]:.1e}, out {errs[1]:.1e}")
    assert max(errs) < 1e-5


@pytest.mark.parametrize("size", [28, 84])
def test_hf_dinov2_resolution_change(tmp_path, size):
    """Dinov2Model run at another size interpolates its table (bicubic, no antialiasing): vitkit built at that
    size from the folder gives the same features, shrinking (2x2 from 4x4) and growing (6x6)."""
    t = pytest.importorskip("transformers")
    ref = randomize(t.Dinov2Model(_hf_cases()["Dinov2Model"]))
    ref.save_pretrained(tmp_path / "ref")
    ours = load_weights(tmp_path / "ref", img_size=size)
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        err = rel_err(ours.forward_features(x), ref(pixel_values=x).last_hidden_state)
    assert err < 1e-5


# --- SigLIP so400m at 384 px in 14 px patches: 27 patches a side, the last 6 pixels not read -----------------
def test_siglip_so400m_384_as_timm_and_transformers(tmp_path):
    """384 is no multiple of 14: timm's and transformers' convolutions read 27 x 14 = 378 pixels a side. vitkit
    builds the name at 384 px (crop_remainder) and computes their outputs on 384 px images, from timm's state
    dict under the name and from an HF folder whose config says image_size=384."""
    timm = pytest.importorskip("timm")
    t = pytest.importorskip("transformers")
    name = "vit_so400m_patch14_siglip_384"
    ref = randomize(timm.create_model(name, pretrained=False, depth=1), std=0.02).eval()
    ours = vitkit.create_model(name, depth=1)
    assert ours.num_params() == sum(p.numel() for p in ref.parameters())
    torch.save(ref.state_dict(), tmp_path / "ref.pth")
    ours = vitkit.create_model(name, weights=tmp_path / "ref.pth", depth=1)
    assert ours.config.img_size == (384, 384) and ours.config.grid_size == (27, 27)
    x = torch.randn(2, 3, 384, 384)
    with torch.no_grad():
        errs = [rel_err(ours(x), ref(x))]
    hf = randomize(t.SiglipVisionModel(t.SiglipVisionConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                                             intermediate_size=128, patch_size=14, image_size=384)))
    hf.eval().save_pretrained(tmp_path / "hf")
    ours = load_weights(tmp_path / "hf")
    assert ours.config.img_size == (384, 384) and ours.config.crop_remainder
    with torch.no_grad():
        o = hf(pixel_values=x)
        feats = ours.forward_features(x)
        errs += [rel_err(feats, o.last_hidden_state), rel_err(ours.forward_head(feats, pre_logits=True),
                                                              o.pooler_output)]
    print("so400m 384/14: timm logits, HF hidden state, HF pooled: " + ", ".join(f"{e:.1e}" for e in errs))
    assert max(errs) < 1e-5
