"""Hugging Face folders in and out: random ViTs saved with save_pretrained, loaded by vitkit, same logits."""
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import vitkit
from _weights import randomize
from vitkit.checkpoints import load_weights, read_checkpoint, save_weights
from vitkit.models.posemb import resize_pos_embed

transformers = pytest.importorskip("transformers")
LABELS = ["cat", "dog", "teapot", "espresso", "zebra", "tench", "kite"]


def hf_model(cls="ViTForImageClassification", seed=0, **kw):
    torch.manual_seed(seed)
    base = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=224,
                patch_size=16, layer_norm_eps=1e-12, hidden_act="gelu")
    base.update(kw)
    cfg = transformers.ViTConfig(**base)
    cfg._attn_implementation = "eager"
    return randomize(getattr(transformers, cls)(cfg).eval())  # non-trivial values everywhere (HF zero-inits some)


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf") / "vit-tiny-hf"
    model = hf_model(num_labels=7, id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)})
    model.save_pretrained(folder)
    return model, folder


def test_folder_logits_config_and_labels(saved):
    hf, folder = saved
    ours = load_weights(folder)
    c = ours.config
    assert (c.width, c.depth, c.num_heads, c.mlp_dim, c.img_size, c.patch_size) == (64, 2, 4, 128, (224, 224), (16, 16))
    assert c.ln_eps == 1e-12 and c.gelu == "exact" and c.num_classes == 7
    assert ours.meta.labels == LABELS and ours.meta.preprocessing["name"] == "hf"
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert rel_err(ours(x), hf(pixel_values=x).logits) < 1e-5


def test_loaded_into_384_bicubic_equals_hf_interpolation(saved):
    hf, folder = saved
    ours = load_weights(folder, img_size=384, resize="bicubic")  # HF interpolates bicubic, half-pixel centres
    x = torch.randn(2, 3, 384, 384)
    with torch.no_grad():
        ref = hf(pixel_values=x, interpolate_pos_encoding=True).logits
        assert rel_err(ours(x), ref) < 1e-5


def test_loaded_into_384_default_is_authors_bilinear(saved):
    scipy_ndimage = pytest.importorskip("scipy.ndimage")
    _, folder = saved
    src = read_checkpoint(folder).state["pos_embed"]
    ours = load_weights(folder, img_size=384)
    pe = ours.pos_embed.detach()
    assert pe.shape == (1, 1 + 24 * 24, 64)
    assert torch.equal(pe[:, 0], src[:, 0])  # the class slot is not resized
    grid = src[0, 1:].reshape(14, 14, 64).double().numpy()
    zoomed = scipy_ndimage.zoom(grid, (24 / 14, 24 / 14, 1), order=1)  # the authors' resize
    np.testing.assert_allclose(pe[0, 1:].reshape(24, 24, 64).numpy(), zoomed, atol=1e-6)
    torch.testing.assert_close(pe, resize_pos_embed(src, (14, 14), (24, 24), 1, "bilinear"))


def test_written_back_as_hf_folder(saved, tmp_path):
    hf, folder = saved
    ours = load_weights(folder)
    out = save_weights(ours, tmp_path / "again", "hf")
    original, written = load_file(str(folder / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert sorted(original) == sorted(written)
    for k in original:  # A -> vitkit -> A: identical tensors
        assert torch.equal(original[k], written[k]), k
    reloaded = transformers.ViTForImageClassification.from_pretrained(out).eval()
    assert reloaded.config.id2label[3] == "espresso" and reloaded.config.layer_norm_eps == 1e-12
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert rel_err(reloaded(pixel_values=x).logits, hf(pixel_values=x).logits) < 1e-5
    assert json.loads((out / "preprocessor_config.json").read_text())["image_mean"] == [0.5, 0.5, 0.5]


def test_vit_model_pooler_is_pre_logits(tmp_path):
    hf = hf_model("ViTModel", seed=1, image_size=32, patch_size=4)
    hf.save_pretrained(tmp_path / "base")
    ours = load_weights(tmp_path / "base")
    assert ours.config.num_classes == 0 and ours.config.representation_size == 64
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = hf(pixel_values=x)
        tokens = ours.forward_features(x)
        assert rel_err(tokens, ref.last_hidden_state) < 1e-5
        assert rel_err(ours.forward_head(tokens, pre_logits=True), ref.pooler_output) < 1e-5
    dropped = load_weights(tmp_path / "base", representation_size=None, num_classes=3)
    assert "pre_logits.fc.weight" not in dropped.state_dict()
    assert torch.count_nonzero(dropped.head.weight) == 0  # fine-tuning head, zero-initialised
    assert any("pre-logits layer dropped" in n for n in dropped.meta.notes)


def test_raw_state_dict_sharded_and_in_memory_names(tmp_path):
    hf = hf_model(seed=2, image_size=32, patch_size=4, num_labels=3, hidden_act="gelu_pytorch_tanh",
                  layer_norm_eps=1e-6)
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    sharded = load_weights(tmp_path / "sharded")
    assert sharded.config.gelu == "tanh" and sharded.config.ln_eps == 1e-6
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")  # transformers 5 in-memory names, no config
    raw = read_checkpoint(tmp_path / "pytorch_model.bin")
    assert raw.format == "hf" and "LayerNorm eps 1e-12" in raw.notes[0] and "num_heads=1 assumed" in raw.notes[1]
    raw_model = load_weights(tmp_path / "pytorch_model.bin", num_heads=4, ln_eps=1e-6, gelu="tanh")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = hf(pixel_values=x).logits
        assert rel_err(sharded(x), ref) < 1e-5
        assert rel_err(raw_model(x), ref) < 1e-5


def _photos():
    """Non-square photos; the last one gives odd crop margins (where torchvision and HF place a crop apart)."""
    skimage_data = pytest.importorskip("skimage.data")
    from PIL import Image
    return {"chelsea": Image.fromarray(skimage_data.chelsea()),  # 451 x 300
            "coffee": Image.fromarray(skimage_data.coffee()),  # 600 x 400
            "odd": Image.fromarray(skimage_data.astronaut()).resize((301, 263))}


@pytest.mark.parametrize("preset", ["hf", "timm-imagenet", "torchvision"])
def test_written_preprocessor_config_is_what_hf_runs(preset, tmp_path):
    """The preprocessor_config.json vitkit writes makes HF's AutoImageProcessor compute the checkpoint's
    own preprocessing on photos of any shape: a squash preset becomes ViTImageProcessor, a shorter-side +
    crop preset BitImageProcessor (shortest_edge, crop_size). HF starts a crop at margin // 2 where
    torchvision / timm round half to even, so where that margin is odd the two can differ by a one-pixel
    shift; reading the folder back gives HF's own placement, which matches HF there too."""
    from vitkit.data.preprocess import get_preset
    model = vitkit.create_model("Ti/16", depth=1, num_classes=3)
    model.meta.preprocessing = get_preset(preset, 224).to_dict()
    out = save_weights(model, tmp_path / "f", "hf")
    processor = transformers.AutoImageProcessor.from_pretrained(out)
    expected = {"hf": "ViTImageProcessor", "timm-imagenet": "BitImageProcessor", "torchvision": "BitImageProcessor"}
    assert type(processor).__name__.startswith(expected[preset])
    back = load_weights(out).meta.preprocessing
    assert (tuple(back["size"]), back["interpolation"], back["resize_mode"], back["resize"]) == (
        (224, 224), get_preset(preset).interpolation, get_preset(preset).resize_mode, get_preset(preset).resize)
    shifted = []
    for name, img in _photos().items():
        theirs = processor(images=img, return_tensors="pt")["pixel_values"][0]
        assert theirs.shape == (3, 224, 224)
        assert (theirs - get_preset(back)(img)).abs().max() < 1e-6, name
        if (theirs - get_preset(preset, 224)(img)).abs().max() > 1e-6:
            shifted.append(name)
    # timm's 248-pixel shorter side leaves a 59-pixel margin on the 301 x 263 photo: round(29.5) = 30 vs 29
    assert shifted == (["odd"] if preset == "timm-imagenet" else [])


@pytest.mark.parametrize("side", [256, 255])
def test_hub_deit_preprocessor_config_read_exactly(side, tmp_path):
    """A hub DeiT folder (DeiTImageProcessor: resize to a side x side square ignoring the aspect ratio,
    centre crop 224 at HF's offsets) gives the same pixels in vitkit as in transformers, on non-square
    photos and with an odd margin (255 - 224)."""
    from vitkit.data.preprocess import get_preset
    out = save_weights(vitkit.create_model("Ti/16", depth=1, num_classes=3), tmp_path / "f", "hf")
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "DeiTImageProcessor", "do_resize": True, "size": side, "do_center_crop": True,
        "crop_size": {"height": 224, "width": 224}, "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}))
    processor = transformers.AutoImageProcessor.from_pretrained(out)
    pre = load_weights(out).meta.preprocessing
    assert (pre["resize_mode"], pre["resize"], pre["crop_rounding"], pre["interpolation"]) == (
        "square", side, "floor", "bicubic")
    for name, img in _photos().items():
        theirs = processor(images=img, return_tensors="pt")["pixel_values"][0]
        assert (theirs - get_preset(pre)(img)).abs().max() < 1e-6, name
    # written back, the folder is a DeiTImageProcessor again
    again = save_weights(load_weights(out), tmp_path / "again", "hf")
    written = json.loads((again / "preprocessor_config.json").read_text())
    assert written["image_processor_type"] == "DeiTImageProcessor"
    assert written["size"] == {"height": side, "width": side}
