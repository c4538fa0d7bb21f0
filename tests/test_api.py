"""The everyday API: create_model(pretrained / weights), classify, create_transform, reset_classifier,
list_models(pattern), model.meta; predict --csv / --device; convert's file-name and overwrite rules; the
atomic writer's permissions and clean-up."""
import csv
import os
import stat

import pytest
import torch
from PIL import Image

import vitkit
from _http_server import FileServer
from _weights import randomize
from vitkit.api import default_weights
from vitkit.checkpoints import save_model, save_weights
from vitkit.cli import main
from vitkit.data.preprocess import get_preset
from vitkit.models.meta import ModelMeta
from vitkit.utils import atomic_path

LABELS = ["red", "green", "blue"]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    torch.manual_seed(0)
    model = vitkit.create_model("Ti/16", img_size=32, depth=1, num_classes=3)
    randomize(model, std=0.2)
    folder = save_model(model, tmp_path_factory.mktemp("m") / "model", labels=LABELS,
                        preprocessing=get_preset("hf", 32))
    return model.eval(), folder


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("img")
    for name, rgb in (("r.png", (250, 10, 10)), ("g.png", (10, 250, 10))):
        Image.new("RGB", (48, 40), rgb).save(d / name)
    (d / "broken.png").write_bytes(b"not an image")
    return d


def test_model_meta_is_declared_and_filled_by_every_loader(small):
    model, folder = small
    fresh = vitkit.create_model("Ti/16", img_size=32, depth=1, num_classes=3)
    assert isinstance(fresh.meta, ModelMeta) and fresh.meta.labels is None and fresh.meta.preprocessing is None
    assert "meta" in vitkit.VisionTransformer.__annotations__
    for m in (vitkit.load_weights(folder), vitkit.checkpoints.load_model(folder)):  # one path for both
        assert m.meta.labels == LABELS and m.meta.format == "vitkit" and m.meta.source == str(folder)
        assert m.meta.preprocessing["name"] == "hf" and m.meta.preprocessing["size"] == [32, 32]
    again = save_model(vitkit.load_weights(folder), folder.parent / "again")  # saving keeps the meta
    assert vitkit.load_weights(again).meta.labels == LABELS


def test_create_model_with_weights_by_url_and_pretrained_names(small, tmp_path, monkeypatch):
    model, folder = small
    data = save_weights(model, tmp_path / "tv.pth", "torchvision").read_bytes()
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    with FileServer() as server:
        server.files["/w/tiny.pth"] = data
        m = vitkit.create_model("Ti/16", weights=server.url + "/w/tiny.pth", num_classes=5)
    assert m.config.num_classes == 5 and torch.count_nonzero(m.head.weight) == 0
    torch.testing.assert_close(m.blocks[0].attn.qkv.weight, model.blocks[0].attn.qkv.weight)
    assert (tmp_path / "torch" / "hub" / "checkpoints" / "tiny.pth").is_file()
    assert default_weights("vit_b_16") == "torchvision/vit_b_16"
    assert default_weights("ViT_B_16_Weights.IMAGENET1K_V1") == "torchvision/vit_b_16"
    assert default_weights("vit_base_patch16_224") == "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k"
    assert default_weights("google/vit-base-patch16-224") == "hf/google/vit-base-patch16-224"
    assert default_weights("hf-hub:timm/vit_small_patch16_224.augreg_in21k") == \
        "hf-hub:timm/vit_small_patch16_224.augreg_in21k"
    with pytest.raises(vitkit.ConfigError, match="no published weights for Ti/16"):
        vitkit.create_model("Ti/16", pretrained=True)
    with pytest.raises(vitkit.WeightsUnavailable, match="offline mode"):
        vitkit.create_model("vit_b_32", pretrained=True, offline=True, cache_dir=tmp_path)


def test_classify_transform_and_reset_classifier(small, images):
    model, folder = small
    preds = vitkit.classify(folder, sorted(images.glob("*.png")), topk=2)
    assert [p.ok for p in preds] == [False, True, True] and "broken.png" in preds[0].source
    assert all(len(p.top) == 2 and p.top[0]["label"] in LABELS for p in preds[1:])
    loaded = vitkit.load_weights(folder)
    transform = vitkit.create_transform(loaded)
    x = transform(images / "r.png")
    assert x.shape == (3, 32, 32)
    with torch.no_grad():
        probs = loaded(x[None]).softmax(-1)[0]
    assert abs(probs.max().item() - preds[2].top[0]["prob"]) < 1e-5  # r.png sorts last
    loaded.reset_classifier(7)
    assert loaded.config.num_classes == 7 and loaded.meta.labels is None
    assert loaded(x[None]).shape == (1, 7) and torch.count_nonzero(loaded.head.weight) == 0
    loaded.reset_classifier(0)
    assert loaded(x[None]).shape == (1, 192)
    fresh = vitkit.create_model("Ti/16", img_size=32, depth=1)  # no preprocessing came with it: the default, said
    with pytest.warns(vitkit.errors.VitkitWarning, match="no preprocessing.*default"):
        tf = vitkit.create_transform(fresh)
    assert tf.name == "authors" and tf.size == (32, 32) and fresh.pretrained_cfg["default_preprocessing"]


def test_list_models_pattern():
    assert vitkit.list_models("B/*") == ["B/32", "B/16", "B/8"]
    assert vitkit.list_models("r50*") and all(n.startswith("R50") for n in vitkit.list_models("r50*"))
    assert vitkit.list_models("nothing*") == []


def test_predict_csv_and_device(small, images, tmp_path, capsys):
    _, folder = small
    out = tmp_path / "res.csv"
    assert main(["predict", str(images), "-w", str(folder), "--csv", str(out), "--device", "cpu",
                 "--topk", "2", "--no-progress"]) == 3  # broken.png is skipped: some images failed
    text = capsys.readouterr().out
    assert "preprocessing: Hugging Face ViTImageProcessor" in text.splitlines()[0] and "input 32x32" in text
    rows = list(csv.DictReader(out.open()))
    assert [r["rank"] for r in rows if r["path"].endswith("g.png")] == ["1", "2"]
    assert [r for r in rows if r["path"].endswith("broken.png")][0]["error"]
    assert {r["label"] for r in rows if r["label"]} <= set(LABELS)
    assert main(["predict", str(images / "r.png"), "-w", str(folder), "--device", "nonsense"]) == 2
    assert "--device 'nonsense'" in capsys.readouterr().err


def test_convert_names_and_overwrite(small, tmp_path, capsys):
    _, folder = small
    dst = tmp_path / "out.safetensors"
    assert main(["convert", str(folder), str(dst), "--to", "timm"]) == 0  # the extension decides: safetensors
    assert dst.read_bytes()[8:9] == b"{"
    assert main(["convert", str(folder), str(dst), "--to", "timm"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["convert", str(folder), str(dst), "--to", "timm", "--force"]) == 0
    img = tmp_path / "photo.png"
    Image.new("RGB", (4, 4)).save(img)
    before = img.read_bytes()
    assert main(["convert", str(folder), str(img), "--to", "npz"]) == 1 and img.read_bytes() == before
    for to, name, msg in (("npz", "w.pth", "name it w.npz"), ("torchvision", "w.npz", ".npz name"),
                          ("hf", "w.safetensors", "writes a folder"), ("torchvision", "w.pth", None)):
        capsys.readouterr()
        args = ["convert", str(folder), str(tmp_path / name), "--to", to]
        if msg is None:  # --safetensors with a .pth name contradicts itself
            args.append("--safetensors")
            msg = "names a PyTorch pickle"
        assert main(args) == 1 and msg in capsys.readouterr().err
        assert not (tmp_path / name).exists()


def test_written_files_honour_the_umask(tmp_path):
    for mask, mode in ((0o027, 0o640), (0o022, 0o644)):
        old = os.umask(mask)
        try:
            with atomic_path(tmp_path / f"a{mask}.txt") as tmp:
                tmp.write_text("x")
        finally:
            os.umask(old)
        assert stat.S_IMODE((tmp_path / f"a{mask}.txt").stat().st_mode) == mode


def test_exclusive_locks_across_processes(tmp_path):
    """utils.exclusive (filelock): another process cannot take a held lock (wait=False: BusyError at once),
    nor can a second lock on the same file in this process; released at the end of the block."""
    import subprocess
    import sys

    from vitkit.errors import BusyError
    from vitkit.utils import exclusive
    lock = tmp_path / "sub" / "x.lock"  # the folder is made
    probe = ("import sys; from vitkit.utils import exclusive; from vitkit.errors import BusyError\n"
             "try:\n    with exclusive(sys.argv[1], wait=False): print('got')\n"
             "except BusyError as e: print('busy', e)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = lambda: subprocess.run([sys.executable, "-c", probe, str(lock)], capture_output=True, text=True,  # noqa: E731
                                 env=env, timeout=120).stdout.strip()
    with exclusive(lock):
        assert run() == f"busy {lock} is held by another process"
        with pytest.raises(BusyError, match="taken"):
            with exclusive(lock, wait=False, busy="taken"):
                pass
    assert run() == "got"


def test_eval_shows_progress_on_stderr(tmp_path, capsys):
    from _synthetic import write_npz

    data = write_npz(tmp_path / "d.npz", n_train=8, n_test=24, size=16, classes=4)
    model = vitkit.create_model("Ti/16", img_size=16, patch_size=8, depth=1, num_classes=4, in_chans=1)
    folder = save_model(model, tmp_path / "m", labels=list("abcd"), preprocessing={"mean": [0.5], "std": [0.5]})
    assert main(["eval", str(folder), "--data", f"tensors:{data}", "--batch-size", "8"]) == 0
    out = capsys.readouterr()
    assert "24 images" in out.out and "eval:" in out.err and "/24 [" in out.err
    assert main(["eval", str(folder), "--data", f"tensors:{data}", "--no-progress"]) == 0
    assert "eval:" not in capsys.readouterr().err
