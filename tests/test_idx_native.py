import gzip
import json

import numpy as np
import pytest
import torch

import vitkit
from _weights import randomize
from vitkit.checkpoints import load_model, save_model
from vitkit.data import find_idx_dataset, load_idx_split, read_idx


def write_idx(path, arr):
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in arr.shape)
    data = header + arr.astype(np.uint8).tobytes()
    if str(path).endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return data


def make_dataset(folder, n=5):
    rng = np.random.default_rng(0)
    written = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images, labels = rng.integers(0, 255, (n, 28, 28)), rng.integers(0, 9, (n,))
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", labels)
        written[split] = images, labels
    return written


def test_read_idx_plain_and_gz(tmp_path):
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "a-idx3-ubyte", arr)
    write_idx(tmp_path / "a-idx3-ubyte.gz", arr)
    np.testing.assert_array_equal(read_idx(tmp_path / "a-idx3-ubyte"), arr)
    np.testing.assert_array_equal(read_idx(tmp_path / "a-idx3-ubyte.gz"), arr)


def test_read_idx_refuses_truncated_and_garbage(tmp_path):
    data = write_idx(tmp_path / "full", np.zeros((3, 4, 4)))
    (tmp_path / "cut").write_bytes(data[:-5])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        read_idx(tmp_path / "cut")
    (tmp_path / "junk").write_bytes(b"\x89PNG\r\n\x1a\n....")
    with pytest.raises(ValueError, match="bad magic"):
        read_idx(tmp_path / "junk")
    (tmp_path / "cut.gz").write_bytes(gzip.compress(data)[:30])
    with pytest.raises(ValueError, match="corrupt or truncated"):
        read_idx(tmp_path / "cut.gz")


def test_dataset_folder_and_missing_message(tmp_path):
    written = make_dataset(tmp_path)
    for split in ("test", "train"):
        images, labels = load_idx_split(split, tmp_path)
        assert images.shape == (5, 28, 28) and labels.dtype == np.int64
        np.testing.assert_array_equal(images, written[split][0])  # the split's own file, in file order
        np.testing.assert_array_equal(labels, written[split][1])
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        find_idx_dataset(defaults=[tmp_path / "nowhere"])
    with pytest.raises(FileNotFoundError, match=f"vitkit data fetch fashion-mnist --dir {tmp_path / 'nowhere'}`"):
        find_idx_dataset(tmp_path / "nowhere")


def test_native_roundtrip(tmp_path):
    model = vitkit.create_model("Ti/16", img_size=32, patch_size=4, depth=2, num_classes=3, posemb="learn2d")
    randomize(model)  # the zero head would make every model's logits 0, and the logit check below empty
    save_model(model, tmp_path / "m", labels=["a", "b", "c"], preprocessing={"mean": [0.5], "std": [0.5]})
    loaded = load_model(tmp_path / "m")
    assert loaded.config == model.config and loaded.meta.labels == ["a", "b", "c"]
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = model.eval()(x)
        assert want.abs().max() > 1e-2 and torch.equal(loaded.eval()(x), want)


def test_native_refuses_corrupt(tmp_path):
    model = vitkit.create_model("Ti/16", img_size=32, patch_size=4, depth=1, num_classes=3)
    folder = save_model(model, tmp_path / "m")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        load_model(folder)
    (folder / "vitkit.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_model(folder)
    meta = json.loads(json.dumps({"format": "vitkit", "version": 99, "config": {}}))
    (folder / "vitkit.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="upgrade vitkit"):
        load_model(folder)


def test_native_with_bare_mean_std_record_loads_through_load_weights(tmp_path):
    """A preprocessing record with only mean/std (one grey channel) means: resize to the model size."""
    model = vitkit.create_model("Ti/16", img_size=28, patch_size=7, in_chans=1, depth=1, num_classes=3)
    save_model(model, tmp_path / "m", preprocessing={"mean": [0.286], "std": [0.353]})
    loaded = vitkit.load_weights(tmp_path / "m")
    pre = loaded.meta.preprocessing
    assert pre["resize_mode"] == "squash" and pre["size"] == [28, 28]
    assert pre["mean"] == [0.286] * 3 and pre["std"] == [0.353] * 3
