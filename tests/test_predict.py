"""`vitkit predict` on real photos (scikit-image's chelsea and coffee), image decoding, preset equivalence."""
import dataclasses
import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from _weights import randomize
from vitkit.checkpoints import load_weights, save_model
from vitkit.cli import main
from vitkit.data.preprocess import ImageError, Preset, find_images, get_preset, load_image
from vitkit.errors import VitkitWarning
from vitkit.predict import classify

skimage_data = pytest.importorskip("skimage.data")
LABELS = ["tabby", "espresso", "teapot", "tench", "kite"]


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    d = tmp_path_factory.mktemp("photos")
    Image.fromarray(skimage_data.chelsea()).save(d / "chelsea.png")
    Image.fromarray(skimage_data.coffee()).save(d / "coffee.jpg", quality=95)
    return d


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint we produced: a small random ViT at 64 px with the torchvision preset and named classes."""
    torch.manual_seed(0)
    model = randomize(vitkit.create_model("Ti/16", img_size=64, patch_size=8, depth=2, num_classes=len(LABELS)),
                      std=0.2)
    folder = tmp_path_factory.mktemp("ckpt") / "tiny-vit"
    return save_model(model, folder, labels=LABELS, preprocessing=get_preset("torchvision", 64))


def test_predict_chelsea_and_coffee_with_crops(photos, checkpoint, tmp_path, capsys):
    crops = tmp_path / "crops"
    files = [str(photos / "chelsea.png"), str(photos / "coffee.jpg")]
    assert main(["predict", *files, "--weights", str(checkpoint), "--save-crop", str(crops), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["path"] for r in rows] == files
    model = load_weights(checkpoint)
    pre = get_preset("torchvision", 64)
    for row, f in zip(rows, files):
        assert [t["rank"] for t in row["top"]] == [1, 2, 3, 4, 5]
        probs = [t["prob"] for t in row["top"]]
        assert probs == sorted(probs, reverse=True) and abs(sum(probs) - 1) < 1e-4  # 5 classes: all of them
        crop = np.asarray(Image.open(row["crop"]))
        assert crop.shape == (64, 64, 3)  # shorter side 73 (= 64 / 0.875), centre crop 64
        expected = pre.crop(f).permute(1, 2, 0).numpy().astype(np.uint8)
        np.testing.assert_array_equal(crop, expected)
        with torch.no_grad():  # the crop saved is exactly what reached the model
            ref = model(pre.normalize(torch.from_numpy(crop.copy()).permute(2, 0, 1).float())[None]).softmax(-1)[0]
        for t in row["top"]:
            assert abs(ref[t["index"]].item() - t["prob"]) < 1e-5 and LABELS[t["index"]] == t["label"]


def test_predict_folder_batches_table_and_skips_corrupt(photos, checkpoint, tmp_path, capsys):
    folder = tmp_path / "mixed"
    folder.mkdir()
    cat = Image.fromarray(skimage_data.chelsea())
    cat.convert("L").save(folder / "gray.png")
    cat.convert("P", palette=Image.ADAPTIVE).save(folder / "palette.png")
    cat.convert("CMYK").save(folder / "cmyk.jpg")
    rgba = cat.convert("RGBA")
    rgba.putalpha(128)
    rgba.save(folder / "rgba.png")
    Image.fromarray((np.asarray(cat.convert("L")).astype(np.uint16) * 257)).save(folder / "deep16.png")
    (folder / "broken.jpg").write_bytes((photos / "coffee.jpg").read_bytes()[:3000])
    (folder / "notes.jpg").write_text("not an image")
    (folder / "sub").mkdir()
    Image.fromarray(skimage_data.coffee()).save(folder / "sub" / "coffee.png")
    files = find_images([folder])
    assert len(files) == 8
    rc = main(["predict", str(folder), "-w", str(checkpoint), "--batch-size", "3", "--topk", "2"])
    out = capsys.readouterr()
    assert rc == 3 and "classified 6 of 8 images, 2 skipped" in out.err  # 3: some files failed
    assert "broken.jpg" in out.err and "truncated" in out.err and "notes.jpg" in out.err
    assert out.out.count("   1. ") == 6 and out.out.count("   2. ") == 6
    model = load_weights(checkpoint)
    one = {p.source: p for p in classify(model, files, batch_size=1, progress=False)}
    many = {p.source: p for p in classify(model, files, batch_size=5, progress=False)}
    assert sum(p.ok for p in one.values()) == 6
    for k, p in one.items():  # batching does not change results
        assert p.ok == many[k].ok
        for a, b in zip(p.top, many[k].top):
            assert a["index"] == b["index"] and abs(a["prob"] - b["prob"]) < 1e-5


def test_load_image_conversions(tmp_path):
    deep = np.array([[0, 32896, 65535]], dtype=np.uint16)  # 16-bit: scaled to 8 bits, not clipped
    Image.fromarray(deep).save(tmp_path / "deep.png")
    assert np.asarray(load_image(tmp_path / "deep.png"))[0, :, 0].tolist() == [0, 128, 255]
    rgba = Image.new("RGBA", (2, 1), (255, 0, 0, 255))
    rgba.putpixel((1, 0), (0, 0, 0, 0))  # fully transparent: shows the white background
    rgba.save(tmp_path / "rgba.png")
    assert np.asarray(load_image(tmp_path / "rgba.png")).tolist() == [[[255, 0, 0], [255, 255, 255]]]
    Image.new("CMYK", (1, 1), (0, 255, 255, 0)).save(tmp_path / "cmyk.jpg", quality=100)
    r, g, b = np.asarray(load_image(tmp_path / "cmyk.jpg"))[0, 0].tolist()
    assert r > 200 and g < 60 and b < 60  # cyan-free, full magenta + yellow = red
    Image.new("1", (3, 3), 1).save(tmp_path / "bw.png")
    assert load_image(tmp_path / "bw.png").mode == "RGB"
    floats = Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32), mode="F")
    assert np.asarray(load_image(floats))[0, :, 1].tolist() == [0, 128, 255]
    with pytest.raises(ImageError, match="not a readable image"):
        (tmp_path / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
        load_image(tmp_path / "x.png")
    with pytest.raises(FileNotFoundError):
        load_image(tmp_path / "missing.png")


def test_presets_rescale_and_hf_processor_equivalence(photos):
    assert get_preset("torchvision").resize == 256 and get_preset("torchvision", 384).resize == 438
    assert get_preset("timm", 384).resize == 426 and get_preset("authors", 384).resize is None
    img = Image.open(photos / "chelsea.png")
    transformers = pytest.importorskip("transformers")
    proc = getattr(transformers, "ViTImageProcessorPil", transformers.ViTImageProcessor)()
    theirs = proc(img, return_tensors="pt")["pixel_values"][0]
    torch.testing.assert_close(get_preset("hf")(img), theirs, rtol=0, atol=1e-6)
    # the authors' pipeline: TF-style bilinear squash (no antialias) then (x - 127.5) / 127.5
    x = torch.from_numpy(np.array(img)).permute(2, 0, 1).float()[None]
    ref = torch.nn.functional.interpolate(x, size=(224, 224), mode="bilinear", align_corners=False)[0]
    torch.testing.assert_close(get_preset("authors")(img), (ref - 127.5) / 127.5, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="unknown preprocessing preset"):
        get_preset("imagenet-ish")
    for bad, match in (({"resize_mode": "fit"}, "resize_mode"), ({"crop_rounding": "ceil"}, "crop_rounding"),
                       ({"resize_mode": "square", "resize": None}, "needs a resize size")):
        with pytest.raises(ValueError, match=match):
            Preset(name="x", **bad)
    # "square" ignores the aspect ratio before the crop: a 40 x 20 image resized to 30 x 30, cropped to 24
    # (margin 6: offset 3 either way); the tensor backend gives the same geometry
    img = Image.fromarray(np.arange(40 * 20 * 3, dtype=np.uint8).reshape(20, 40, 3))
    sq = Preset(name="sq", size=(24, 24), resize=30, resize_mode="square", interpolation="nearest",
                crop_rounding="floor")
    ref = np.array(img.resize((30, 30), Image.NEAREST))[3:27, 3:27]
    assert torch.equal(sq.crop(img), torch.from_numpy(ref).permute(2, 0, 1).float())
    assert dataclasses.replace(sq, backend="tensor").crop(img).shape == (3, 24, 24)
    assert sq.with_size(48).resize == 60 and sq.with_size(48).resize_mode == "square"


def test_predict_errors(checkpoint, photos, tmp_path):
    model = load_weights(checkpoint)
    with pytest.raises(ValueError, match="topk"):
        list(classify(model, [photos / "chelsea.png"], topk=0))
    model.meta.preprocessing = None  # weights that said nothing: the default pipeline, with a warning
    with pytest.warns(VitkitWarning, match="no preprocessing"):
        assert len(list(classify(model, [photos / "chelsea.png"], progress=False))) == 1
    with pytest.raises(FileNotFoundError):
        find_images([tmp_path / "nowhere"])


def test_single_channel_model_gets_luma(photos):
    torch.manual_seed(1)
    model = randomize(vitkit.create_model("Ti/16", img_size=32, patch_size=8, depth=1, num_classes=3, in_chans=1),
                      std=0.2)
    pre = get_preset("hf", 32)
    (pred,) = classify(model, [photos / "chelsea.png"], preset="hf", topk=3, progress=False)
    gray = np.asarray(Image.open(photos / "chelsea.png").resize((32, 32), Image.BILINEAR).convert("L"), np.float32)
    x = pre.normalize(torch.from_numpy(gray)[None])  # PIL's own RGB -> L conversion, then mean = std = 0.5
    with torch.no_grad():
        ref = model(x[None]).softmax(-1)[0]
    for t in pred.top:
        assert abs(ref[t["index"]].item() - t["prob"]) < 2e-3  # PIL rounds L to integers; we keep fractions


def test_predict_at_another_size_describes_what_runs(photos, checkpoint, capsys):
    """The printed preprocessing is the one that runs at --img-size (the declared 64 px preset at 96 px:
    shorter side floor(96 / (64/73)) = 109, centre crop 96), also in each row's geometry."""
    assert main(["predict", str(photos / "chelsea.png"), "-w", str(checkpoint), "--img-size", "96"]) == 0
    out = capsys.readouterr().out
    head = out.splitlines()[0]
    assert "input 96x96; preprocessing: torchvision IMAGENET1K_V1: shorter side 109 bilinear (antialiased), " \
           "centre crop 96, ImageNet mean/std" in head
    assert "crop 96x96" in out and "73" not in head and "64" not in head
