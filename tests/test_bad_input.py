"""A corpus of bad input, each case run through the command line as a careful user would.

Every case asserts the documented ending (CONTRIBUTING.md, "Errors and exit codes"): an expected failure is one
line ``vitkit CMD: error: ...`` naming the file or key (exit code 1; 2 for usage errors), never a
traceback, and leaves no partial output; a many-file command reports each bad file, goes on with the
rest and exits 3 when some failed. The corpus covers these kinds of bad input: output paths that cannot
be created, damaged or hostile data and checkpoints, mistyped overrides, wrong-shaped and non-finite
weights, odd images (decompression bombs, broken EXIF, non-UTF-8 names, symlink loops, empty folders),
read-only run folders and a full disk (a file-size limit).
"""
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

import vitkit
from _synthetic import write_npz, write_recipe
from vitkit.cli import main

SRC = str(Path(vitkit.__file__).resolve().parents[1])
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))


# --- the corpus's files ---------------------------------------------------------------------------------
def _png_bomb(path, side=30000):
    """A tiny PNG that claims 30000 x 30000 pixels (a decompression bomb): PIL refuses it on opening."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
                     + chunk(b"IEND", b""))


def _rewrite_pickle(src, dst, payload):
    """A copy of the torch zip ``src`` whose data.pkl is replaced by ``payload`` (the zip stays intact)."""
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w") as zo:
        for name in zi.namelist():
            zo.writestr(name, payload if name.endswith("data.pkl") else zi.read(name))


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("true",))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    ns = SimpleNamespace(d=d)
    model = vitkit.create_model("Ti/16", img_size=32, depth=1, num_classes=4)
    ns.model = d / "model"
    vitkit.save_weights(model, ns.model, to="vitkit")
    meta = json.loads((ns.model / "vitkit.json").read_text())
    meta["preprocessing"] = vitkit.get_preset("hf", (32, 32)).to_dict()
    (ns.model / "vitkit.json").write_text(json.dumps(meta))
    ns.timm = d / "timm.safetensors"
    vitkit.save_weights(model, ns.timm, to="timm", safetensors=True)
    state = load_file(str(ns.timm))
    wrong = dict(state, **{"blocks.0.attn.proj.weight": torch.zeros(192, 100)})
    ns.wrong_shape = d / "wrong_shape.safetensors"
    save_file(wrong, str(ns.wrong_shape))
    ns.int_weights = d / "int_weights.safetensors"
    save_file(dict(state, **{"blocks.0.attn.proj.weight": torch.zeros(192, 192, dtype=torch.int32)}),
              str(ns.int_weights))
    ns.nan = d / "nan"
    nan_model = vitkit.create_model("Ti/16", img_size=32, depth=1, num_classes=4)
    with torch.no_grad():
        nan_model.blocks[0].mlp.fc1.weight.fill_(float("nan"))
    vitkit.save_weights(nan_model, ns.nan, to="vitkit")
    (ns.nan / "vitkit.json").write_text(json.dumps(dict(json.loads((ns.nan / "vitkit.json").read_text()),
                                                        preprocessing=meta["preprocessing"])))
    ns.garbage_json = d / "garbage_json"
    shutil.copytree(ns.model, ns.garbage_json)
    (ns.garbage_json / "vitkit.json").write_text('{"format": "vitkit",\n  "version": 1,\n  "config": {oops}\n')
    ns.no_weights = d / "no_weights"
    ns.no_weights.mkdir()
    shutil.copy(ns.model / "vitkit.json", ns.no_weights / "vitkit.json")
    ns.pth = d / "tv.pth"
    vitkit.save_weights(model, ns.pth, to="torchvision")
    ns.corrupt_pickle = d / "corrupt_pickle.pth"
    _rewrite_pickle(ns.pth, ns.corrupt_pickle, b"\x80\x02garbage, not a pickle")
    ns.hostile_pickle = d / "hostile_pickle.pth"
    import pickle
    _rewrite_pickle(ns.pth, ns.hostile_pickle, pickle.dumps({"x": _RunsCode()}, protocol=2))
    ns.truncated = d / "truncated.safetensors"
    ns.truncated.write_bytes(ns.timm.read_bytes()[:5000])
    ns.empty_file = d / "empty.pth"
    ns.empty_file.write_bytes(b"")
    ns.random = d / "random.bin"
    ns.random.write_bytes(b"{\xff\xfe" + os.urandom(4093))  # binary, though it starts like JSON
    ns.a_file = d / "a_file.txt"
    ns.a_file.write_text("a regular file\n")

    # images
    ns.good = d / "good.png"
    Image.effect_mandelbrot((48, 40), (-2, -1.2, 1, 1.2), 50).convert("RGB").save(ns.good)
    ns.corrupt_img = d / "corrupt.png"
    ns.corrupt_img.write_bytes(b"not an image at all")
    ns.truncated_img = d / "truncated.png"
    ns.truncated_img.write_bytes(ns.good.read_bytes()[:60])
    ns.zero_img = d / "zero.jpg"
    ns.zero_img.write_bytes(b"")
    ns.bomb = d / "bomb.png"
    _png_bomb(ns.bomb)
    ns.odd_exif = d / "odd_exif.jpg"
    Image.open(ns.good).save(ns.odd_exif, exif=b"Exif\x00\x00II*\x00\x08\x00\x00\x00\xff\xff garbage")
    ns.bad_orientation = d / "bad_orientation.jpg"
    exif = Image.Exif()
    exif[0x0112] = 9  # Orientation 9 does not exist
    Image.open(ns.good).save(ns.bad_orientation, exif=exif)
    ns.empty_dir = d / "empty_dir"
    ns.empty_dir.mkdir()
    ns.loop = d / "loop.png"
    os.symlink(ns.loop, ns.loop)
    ns.dir_named_png = d / "folder.png"
    ns.dir_named_png.mkdir()

    # data
    ns.npz = write_npz(d / "quadrants.npz", n_train=64, n_test=32)
    ns.recipe = write_recipe(d, ns.npz, val_size=None)  # small data sets: no validation split
    raw = ns.npz.read_bytes()
    ns.trunc_npz = d / "trunc.npz"
    ns.trunc_npz.write_bytes(raw[: len(raw) // 2])
    ns.obj_npz = d / "objects.npz"
    np.savez(ns.obj_npz, images=np.array([{"a": 1}] * 4, dtype=object), labels=np.arange(4))
    ns.hostile_pt = d / "hostile.pt"
    torch.save({"images": _RunsCode()}, ns.hostile_pt)
    ns.junk_pt = d / "junk.pt"
    ns.junk_pt.write_bytes(b"\x80\x02garbage")
    ns.no_images = d / "no_images"
    (ns.no_images / "cat").mkdir(parents=True)
    (ns.no_images / "cat" / "readme.txt").write_text("no images here")
    ns.fold = d / "fold"  # an image folder with one unreadable file
    for cls in ("a", "b"):
        (ns.fold / cls).mkdir(parents=True)
        for i in range(4):
            shutil.copy(ns.good, ns.fold / cls / f"{i}.png")
    shutil.copy(ns.corrupt_img, ns.fold / "a" / "zz.png")
    ns.bad_yaml = d / "bad.yaml"
    ns.bad_yaml.write_text("model: {width: [1, 2\noptim: : :\n")
    return ns


# --- one case -------------------------------------------------------------------------------------------
def run(capsys, argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_one_line_error(err, command, code, expected_code=1):
    assert code == expected_code, err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if f"vitkit {command}: error:" in ln]
    assert len(lines) == 1, err
    return lines[0]


CASES = {
    # output paths that cannot be created (a regular file where a folder is needed)
    "convert-under-a-file-pth": (lambda c: ["convert", c.model, c.a_file / "out.pth", "--to", "torchvision"],
                                 1, ["a_file.txt"]),
    "convert-under-a-file-hf": (lambda c: ["convert", c.model, c.a_file / "out", "--to", "hf"], 1, ["a_file.txt"]),
    "convert-under-a-file-timm": (lambda c: ["convert", c.model, c.a_file / "out", "--to", "timm"], 1,
                                  ["a_file.txt"]),
    "recipe-save-under-a-file": (lambda c: ["recipes", "fmnist-fast", "--save", c.a_file / "r.yaml"], 1,
                                 ["a_file.txt"]),
    "train-out-under-a-file": (lambda c: ["train", "-r", c.recipe, "--out", c.a_file / "run", "--no-progress"], 1,
                               ["a_file.txt"]),
    "predict-save-crop-under-a-file": (lambda c: ["predict", c.good, "-w", c.model, "--save-crop",
                                                  c.a_file / "crops", "--no-progress"], 1, ["a_file.txt"]),
    "analyze-out-under-a-file": (lambda c: ["analyze", c.model, c.good, "--out", c.a_file / "an"], 1,
                                 ["a_file.txt"]),
    # broken training data
    "tensors-truncated-npz": (lambda c: ["train", "--data", f"tensors:{c.trunc_npz}", "-r", c.recipe, "--out",
                                         c.d / "run-x"], 1, ["trunc.npz", "corrupt"]),
    "tensors-object-arrays": (lambda c: ["train", "--data", f"tensors:{c.obj_npz}", "-r", c.recipe, "--out",
                                         c.d / "run-x"], 1, ["objects.npz", "object arrays"]),
    "tensors-hostile-pickle": (lambda c: ["train", "--data", f"tensors:{c.hostile_pt}", "-r", c.recipe, "--out",
                                          c.d / "run-x"], 1, ["hostile.pt", "refused"]),
    "tensors-corrupt-pickle": (lambda c: ["train", "--data", f"tensors:{c.junk_pt}", "-r", c.recipe, "--out",
                                          c.d / "run-x"], 1, ["junk.pt", "corrupt"]),
    "tensors-missing": (lambda c: ["train", "--data", f"tensors:{c.d / 'nope.npz'}", "-r", c.recipe, "--out",
                                   c.d / "run-x"], 1, ["nope.npz", "not found"]),
    "folder-without-classes": (lambda c: ["train", "--data", f"folder:{c.empty_dir}", "-r", c.recipe, "--out",
                                          c.d / "run-x"], 1, ["empty_dir", "class sub-folders"]),
    "folder-without-images": (lambda c: ["train", "--data", f"folder:{c.no_images}", "-r", c.recipe, "--out",
                                         c.d / "run-x"], 1, ["no_images", "no images"]),
    "train-folder-bad-image-in-a-worker": (lambda c: ["train", "-r", c.recipe, "--data", f"folder:{c.fold}", "--set",
                                                      "data.workers=2", "--set", "data.eval_split=null", "--steps",
                                                      "6", "--set", "optim.batch_size=9", "--out", c.d / "run-w"],
                                           1, ["zz.png", "not a readable image"]),
    "unknown-dataset": (lambda c: ["train", "--data", "imagenet-99:/x", "-r", c.recipe, "--out", c.d / "run-x"], 1,
                        ["unknown dataset"]),
    "eval-truncated-data": (lambda c: ["eval", c.model, "--data", f"tensors:{c.trunc_npz}"], 1, ["trunc.npz"]),
    # overrides with the wrong type, unknown keys, broken recipes
    "set-lr-abc": (lambda c: ["recipes", "fmnist-fast", "--set", "lr=abc"], 1, ["optim.lr", "'abc'", "a number"]),
    "set-steps-abc": (lambda c: ["recipes", "fmnist-fast", "--set", "schedule.steps=abc"], 1,
                      ["schedule.steps", "'abc'", "an integer"]),
    "set-compile-maybe": (lambda c: ["recipes", "fmnist-fast", "--set", "train.compile=maybe"], 1,
                          ["train.compile", "'maybe'", "true or false"]),
    "set-betas-one-value": (lambda c: ["recipes", "fmnist-fast", "--set", "optim.betas=[0.9]"], 1,
                            ["optim.betas", "a list of 2 numbers"]),
    "set-model-width-abc": (lambda c: ["recipes", "fmnist-fast", "--set", "model.width=abc"], 1,
                            ["model.width", "'abc'", "an integer"]),
    "train-set-lr-abc": (lambda c: ["train", "-r", c.recipe, "--set", "lr=abc", "--out", c.d / "run-x"], 1,
                         ["optim.lr", "'abc'"]),
    "info-width-abc": (lambda c: ["info", "B/16", "--set", "width=abc"], 1, ["width", "'abc'", "an integer"]),
    "info-img-size-triple": (lambda c: ["info", "B/16", "--set", "img_size=[1,2,3]"], 1, ["img_size"]),
    "set-unknown-key": (lambda c: ["recipes", "fmnist-fast", "--set", "learning_rate=1"], 1,
                        ["learning_rate"]),
    "set-without-value": (lambda c: ["recipes", "fmnist-fast", "--set", "lr"], 2, ["key=value"]),
    "negative-lr": (lambda c: ["recipes", "fmnist-fast", "--set", "lr=-1"], 1, ["optim.lr"]),
    # out-of-range overrides fail before any work starts (no run folder is made)
    "set-batch-size-0": (lambda c: ["recipes", "fmnist-fast", "--set", "optim.batch_size=0"], 1,
                         ["optim.batch_size", "got 0", "a positive number"]),
    "set-steps-0": (lambda c: ["recipes", "fmnist-fast", "--set", "schedule.steps=0"], 1, ["schedule.steps"]),
    "set-depth-0": (lambda c: ["recipes", "fmnist-fast", "--set", "model.depth=0"], 1, ["depth", "positive"]),
    "set-ema-1": (lambda c: ["recipes", "fmnist-fast", "--set", "train.ema=1"], 1, ["train.ema", "[0, 1)"]),
    "set-std-0": (lambda c: ["recipes", "fmnist-fast", "--set", "data.std=[0]"], 1, ["data.std"]),
    "train-eval-batch-0": (lambda c: ["train", "-r", c.recipe, "--set", "data.eval_batch_size=0", "--out",
                                      c.d / "run-x"], 1, ["data.eval_batch_size"]),
    "train-log-every-0": (lambda c: ["train", "-r", c.recipe, "--set", "train.log_every=0", "--out",
                                     c.d / "run-x"], 1, ["train.log_every"]),
    "train-infinite-epochs": (lambda c: ["train", "-r", c.recipe, "--epochs", "inf", "--out", c.d / "run-x"], 2,
                              ["--epochs"]),
    "train-nan-lr": (lambda c: ["train", "-r", c.recipe, "--lr", "nan", "--out", c.d / "run-x"], 2, ["--lr"]),
    "eval-negative-workers": (lambda c: ["eval", c.model, "--data", f"tensors:{c.npz}", "--workers", "-1"], 2,
                              ["--workers"]),
    "unknown-recipe": (lambda c: ["recipes", "fmnist-fastest"], 1, ["fmnist-fastest"]),
    "recipe-invalid-yaml": (lambda c: ["recipes", c.bad_yaml], 1, ["bad.yaml", "YAML"]),
    "recipe-missing-file": (lambda c: ["recipes", c.d / "missing.yaml"], 1, ["missing.yaml", "not found"]),
    # checkpoints: wrong shapes and dtypes, damaged, hostile, non-finite
    "convert-wrong-shape-to-hf": (lambda c: ["convert", c.wrong_shape, c.d / "ws-hf", "--to", "hf"], 1,
                                  ["wrong_shape.safetensors", "wrong shape", "blocks.0.attn.proj.weight"]),
    "convert-wrong-shape-to-timm": (lambda c: ["convert", c.wrong_shape, c.d / "ws.pth", "--to", "timm"], 1,
                                    ["wrong shape"]),
    "convert-wrong-shape-to-vitkit": (lambda c: ["convert", c.wrong_shape, c.d / "ws-vk", "--to", "vitkit"], 1,
                                      ["wrong shape"]),
    "inspect-wrong-shape": (lambda c: ["inspect", c.wrong_shape], 1, ["wrong shape"]),
    "predict-wrong-shape": (lambda c: ["predict", c.good, "-w", c.wrong_shape, "--no-progress"], 1,
                            ["wrong shape"]),
    "export-wrong-shape": (lambda c: ["export", c.wrong_shape, c.d / "ws.onnx"], 1, ["wrong shape"]),
    "inspect-integer-weights": (lambda c: ["inspect", c.int_weights], 1, ["not floating point", "int32"]),
    "inspect-garbage-vitkit-json": (lambda c: ["inspect", c.garbage_json], 1,
                                    ["vitkit.json", "not valid JSON", "line 3"]),
    "predict-garbage-vitkit-json": (lambda c: ["predict", c.good, "-w", c.garbage_json, "--no-progress"], 1,
                                    ["vitkit.json", "line 3"]),
    "analyze-garbage-vitkit-json": (lambda c: ["analyze", c.garbage_json, c.good, "--out", c.d / "an-x"], 1,
                                    ["vitkit.json", "line 3"]),
    "vitkit-folder-without-weights": (lambda c: ["inspect", c.no_weights], 1, ["model.safetensors"]),
    "corrupt-pickle-in-intact-zip": (lambda c: ["inspect", c.corrupt_pickle], 1, ["corrupt_pickle.pth", "corrupt"]),
    "hostile-pickle": (lambda c: ["inspect", c.hostile_pickle], 1, ["refused", "execute code"]),
    "truncated-safetensors": (lambda c: ["convert", c.truncated, c.d / "tr-hf", "--to", "hf"], 1,
                              ["truncated.safetensors"]),
    "empty-weights-file": (lambda c: ["inspect", c.empty_file], 1, ["empty.pth", "empty"]),
    "random-bytes": (lambda c: ["inspect", c.random], 1, ["random.bin", "not a weights file"]),
    "unknown-checkpoint-name": (lambda c: ["predict", c.good, "-w", "vit_huge_nope", "--no-progress"], 1,
                                ["vit_huge_nope"]),
    "resume-without-run": (lambda c: ["train", "-r", c.recipe, "--out", c.d / "no-run", "--resume"], 1,
                           ["no checkpoint"]),
    # usage errors
    "predict-img-size-0": (lambda c: ["predict", c.good, "-w", c.model, "--img-size", "0"], 2, ["--img-size"]),
    "predict-topk-0": (lambda c: ["predict", c.good, "-w", c.model, "--topk", "0"], 2, ["--topk"]),
    "info-img-size-negative": (lambda c: ["info", "B/16", "--img-size", "-5"], 2, ["--img-size"]),
    "resume-without-out": (lambda c: ["train", "--resume"], 2, ["--out"]),
}

# what a failed case must not leave behind
NO_OUTPUT = {"convert-wrong-shape-to-hf": ["ws-hf"], "convert-wrong-shape-to-timm": ["ws.pth"],
             "convert-wrong-shape-to-vitkit": ["ws-vk"], "truncated-safetensors": ["tr-hf"],
             "export-wrong-shape": ["ws.onnx"], "analyze-garbage-vitkit-json": ["an-x"]}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_ends_in_one_line(corpus, capsys, name):
    argv, expected_code, fragments = CASES[name]
    code, out, err = run(capsys, argv(corpus))
    if expected_code == 2:  # argparse or vitkit's usage errors: exit 2, a message, no traceback
        assert code == 2 and "Traceback" not in err and "error:" in err, err
        line = err
    else:
        line = assert_one_line_error(err, argv(corpus)[0], code)
    for frag in fragments:
        assert frag in line, (frag, line)
    for rel in NO_OUTPUT.get(name, []) + ["run-x"]:
        assert not (corpus.d / rel).exists(), rel
    assert not list(corpus.d.glob(".*.tmp")), "temporary files left behind"


def test_corrupt_pickle_is_not_called_hostile(corpus, capsys):
    _, _, err = run(capsys, ["inspect", corpus.corrupt_pickle])
    assert "corrupt" in err and "execute code" not in err and "refused" not in err


# --- many files: report each, skip it, go on, say so in the exit code ---------------------------------------
def test_predict_skips_every_kind_of_bad_file_and_exits_3(corpus, capsys):
    bad = [corpus.corrupt_img, corpus.truncated_img, corpus.zero_img, corpus.bomb, corpus.d / "missing.png",
           corpus.empty_dir, corpus.loop, corpus.dir_named_png]
    code, out, err = run(capsys, ["predict", corpus.good, *bad, corpus.odd_exif, corpus.bad_orientation,
                                  "-w", corpus.model, "--no-progress", "--json"])
    assert code == 3 and "Traceback" not in err
    skipped = [ln for ln in err.splitlines() if "vitkit predict: skipped" in ln]
    assert len(skipped) == len(bad), err
    for p in bad:
        assert any(str(p) in ln for ln in skipped), p
    assert any("implausibly large" in ln for ln in skipped if "bomb.png" in ln)
    rows = [json.loads(ln) for ln in out.splitlines()]
    classified = [r["path"] for r in rows if "top" in r]
    # odd EXIF is not an error
    assert classified == [str(corpus.good), str(corpus.odd_exif), str(corpus.bad_orientation)]
    assert "classified 3 of 11 images, 8 skipped" in err


def test_predict_with_nothing_usable_exits_1(corpus, capsys):
    code, _, err = run(capsys, ["predict", corpus.d / "missing.png", corpus.empty_dir, "-w", corpus.model,
                                "--no-progress"])
    assert code == 1 and "Traceback" not in err and err.count("skipped") >= 2


def test_predict_non_finite_weights_warn_and_outputs_are_refused(corpus, capsys):
    code, out, err = run(capsys, ["predict", corpus.good, "-w", corpus.nan, "--no-progress"])
    assert code == 1 and "Traceback" not in err
    assert "warning:" in err and "non-finite weights" in err and "blocks.0.mlp.fc1.weight" in err
    assert "not finite" in err and "nan%" not in out.lower()


def test_analyze_skips_a_bad_image_like_predict(corpus, capsys):
    out_dir = corpus.d / "analysis"
    code, _, err = run(capsys, ["analyze", corpus.model, corpus.good, corpus.corrupt_img, corpus.d / "missing.png",
                                "--out", out_dir, "--filters", "4"])
    assert code == 3 and "Traceback" not in err, err
    assert err.count("vitkit analyze: skipped") == 2 and (out_dir / "summary.json").is_file()


def test_eval_over_a_folder_skips_unreadable_images_and_exits_3(corpus, capsys, tmp_path):
    folder = tmp_path / "folder"
    for cls in ("a", "b"):
        (folder / cls).mkdir(parents=True)
        for i in range(3):
            shutil.copy(corpus.good, folder / cls / f"{i}.png")
    shutil.copy(corpus.corrupt_img, folder / "a" / "broken.png")
    shutil.copy(corpus.truncated_img, folder / "b" / "cut.png")
    code, out, err = run(capsys, ["eval", corpus.model, "--data", f"folder:{folder}", "--split", "train", "--json"])
    assert code == 3 and "Traceback" not in err, err
    assert err.count("vitkit eval: skipped") == 2 and "broken.png" in err and "cut.png" in err
    assert json.loads(out)["n"] == 6 and "evaluated 6 of 8 images, 2 skipped" in err
    for cls in ("a", "b"):
        for i in range(3):
            (folder / cls / f"{i}.png").unlink()
    code, _, err = run(capsys, ["eval", corpus.model, "--data", f"folder:{folder}", "--split", "train"])
    assert code == 1 and "Traceback" not in err and err.count("vitkit eval: skipped") == 2


def test_non_utf8_file_names_print(corpus, tmp_path):
    folder = tmp_path / "names"
    folder.mkdir()
    name = os.fsencode(folder) + b"/caf\xe9-\xff.png"  # Latin-1 bytes: not valid UTF-8
    with open(name, "wb") as f:
        f.write(corpus.good.read_bytes())
    r = subprocess.run([sys.executable, "-m", "vitkit", "predict", str(folder), "-w", str(corpus.model),
                        "--no-progress", "--topk", "1"], capture_output=True, env=ENV, timeout=120)
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr
    assert b"caf" in r.stdout and b"1." in r.stdout


def test_a_recipe_file_with_an_infinite_rate_fails_before_training(corpus, capsys, tmp_path):
    bad = tmp_path / "inf.yaml"
    bad.write_text(corpus.recipe.read_text().replace("lr: 5.0e-3", "lr: .inf"))
    code, _, err = run(capsys, ["train", "-r", bad, "--out", tmp_path / "run"])
    line = assert_one_line_error(err, "train", code)
    assert "optim.lr" in line and "finite" in line and not (tmp_path / "run").exists()


def test_topk_above_the_class_count_is_clamped_with_a_note(corpus, capsys):
    code, out, err = run(capsys, ["predict", corpus.good, "-w", corpus.model, "--topk", "9", "--json",
                                  "--no-progress"])
    assert code == 0 and "Traceback" not in err
    assert "warning: topk=9 is more than the model's 4 classes: showing all 4" in err
    assert len(json.loads(out.splitlines()[0])["top"]) == 4


# --- exit codes decided by the exception's type ---------------------------------------------------------------
def test_diverged_training_exits_1_naming_the_step_and_the_fix(corpus, capsys, tmp_path):
    code, _, err = run(capsys, ["train", "-r", corpus.recipe, "--out", tmp_path / "run", "--no-progress",
                                "--set", "optim.lr=1e30", "--set", "schedule.warmup_steps=0"])
    line = assert_one_line_error(err, "train", code)
    assert "training diverged at step" in line and "lower the learning rate" in line


def test_a_full_disk_through_the_cli_is_one_line(monkeypatch, capsys, tmp_path):
    """ENOSPC from the write itself (as a full disk raises it, without a file name): one line naming the
    file and what to do, exit 1, nothing left behind."""
    import errno

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    code, _, err = run(capsys, ["recipes", "fmnist-fast", "--save", tmp_path / "r.yaml"])
    line = assert_one_line_error(err, "recipes", code)
    assert "r.yaml" in line and "no space left" in line
    assert list(tmp_path.iterdir()) == []


def test_export_without_onnx_names_the_extra_before_loading(corpus, capsys, monkeypatch, tmp_path):
    import vitkit.cli.checkpoints as cli_checkpoints

    monkeypatch.setitem(sys.modules, "onnx", None)  # as if the onnx extra were not installed
    monkeypatch.setattr(cli_checkpoints, "_load", lambda *a, **k: pytest.fail("loaded the model first"))
    code, _, err = run(capsys, ["export", corpus.model, tmp_path / "m.onnx"])
    line = assert_one_line_error(err, "export", code)
    assert "onnx" in line and "pip install 'vitkit[onnx]'" in line and "bug" not in err


# --- the boundary itself --------------------------------------------------------------------------------------
def test_a_bug_shows_its_traceback_and_asks_to_be_reported(corpus, capsys, monkeypatch):
    import vitkit.cli.model as model_cli

    def broken(args):
        return {}["no such key"]  # a genuine bug: not an expected failure

    monkeypatch.setattr(model_cli, "format_cost", lambda *a, **k: broken(None))
    code, _, err = run(capsys, ["info", "B/16"])
    assert code == 70 and "Traceback" in err and "KeyError" in err and "bug in vitkit" in err


def test_debug_shows_the_traceback_of_an_expected_error(corpus, capsys):
    code, _, err = run(capsys, ["inspect", corpus.random, "--debug"])
    assert code == 1 and "Traceback" in err and "vitkit inspect: error:" in err
    code, _, err = run(capsys, ["--debug", "inspect", corpus.random])
    assert code == 1 and "Traceback" in err


def test_library_errors_name_their_subject():
    from vitkit.errors import CheckpointError, ConfigError, VitkitError
    err = ConfigError("got 'abc', expected a number", key="optim.lr", hint="e.g. optim.lr=3e-4")
    assert str(err) == "optim.lr: got 'abc', expected a number: e.g. optim.lr=3e-4"
    assert isinstance(err, ValueError) and isinstance(err, VitkitError)
    err = CheckpointError("is corrupt", path=Path("/x/model.safetensors"))
    assert str(err) == "/x/model.safetensors: is corrupt" and err.path == Path("/x/model.safetensors")


# --- run folders that cannot be written, a full disk -------------------------------------------------------------
def _subprocess(argv, *, preexec=None, prefix=()):
    return subprocess.run([*prefix, sys.executable, "-m", "vitkit", *map(str, argv)], capture_output=True, text=True,
                          env=ENV, timeout=300, preexec_fn=preexec)


def _file_size_limit(nbytes):
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return limit


@pytest.mark.parametrize("to", ["hf", "torchvision"])  # a folder of files, one file
def test_a_full_disk_is_one_line_and_leaves_nothing(corpus, tmp_path, to):
    dst = tmp_path / ("out" if to == "hf" else "out.pth")
    r = _subprocess(["convert", corpus.model, dst, "--to", to], preexec=_file_size_limit(20_000))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("vitkit convert: error:") and str(dst) in line
    assert "file-size limit" in line or "too large" in line
    assert list(tmp_path.iterdir()) == []  # no partial output, no temporary files


def test_training_on_a_full_disk_stops_in_one_line(corpus, tmp_path):
    run_dir = tmp_path / "run"
    r = _subprocess(["train", "-r", corpus.recipe, "--out", run_dir, "--no-progress"], preexec=_file_size_limit(60_000))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "vitkit train: error:" in r.stderr and "last.pt" in r.stderr
    assert not list(run_dir.rglob("*.tmp"))


def _without_root_powers():
    """A command prefix under which file permissions apply, also for root (whose powers bypass them)."""
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: file permissions cannot be enforced")
    return ("setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner")


def test_a_read_only_run_folder_is_one_line(corpus, tmp_path):
    prefix = _without_root_powers()
    run_dir = tmp_path / "run"
    r = _subprocess(["train", "-r", corpus.recipe, "--out", run_dir, "--no-progress", "--steps", "8"])
    assert r.returncode == 0, r.stderr
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    for p in [run_dir, *run_dir.rglob("*")]:
        if p.is_dir():
            p.chmod(0o555)
    try:
        r = _subprocess(["train", "-r", corpus.recipe, "--out", run_dir, "--no-progress", "--steps", "8", "--resume"],
                        prefix=prefix)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        line = r.stderr.strip().splitlines()[-1]
        assert line.startswith("vitkit train: error:") and str(run_dir) in line and "permission" in line
        r = _subprocess(["predict", corpus.good, "-w", corpus.model, "--save-crop", run_dir / "crops", "--no-progress"],
                        prefix=prefix)
        assert r.returncode == 1 and "Traceback" not in r.stderr and "permission" in r.stderr, r.stderr
    finally:
        for p in [run_dir, *run_dir.rglob("*")]:
            if p.is_dir():
                p.chmod(0o755)
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before  # nothing added or lost
