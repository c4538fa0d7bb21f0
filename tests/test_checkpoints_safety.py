"""Refusals: code-carrying pickles, truncated files of every kind, layouts that are not the paper's ViT."""
import os

import numpy as np
import pytest
import torch

import vitkit
from vitkit.checkpoints import load_weights, read_checkpoint, save_weights
from vitkit.cli import main


def tiny(**kw):
    return vitkit.create_model("Ti/16", img_size=16, patch_size=4, depth=1, num_classes=3, **kw)


class RunsCode:
    """Unpickling this calls os.system: what a malicious checkpoint does."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("zip_format", [True, False])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, zip_format):
    marker = tmp_path / "pwned"
    state = {k: v for k, v in tiny().state_dict().items()}
    state["__evil__"] = RunsCode(marker)
    path = tmp_path / "evil.pth"
    torch.save(state, path, _use_new_zipfile_serialization=zip_format)
    with pytest.raises(ValueError) as err:
        load_weights(path)
    msg = str(err.value)
    assert "refused" in msg and "execute code" in msg and "system" in msg
    assert not marker.exists()
    rc = main(["inspect", str(path)])  # the CLI reports it in one line, exit 1
    assert rc == 1 and not marker.exists()


def test_object_array_npz_is_refused(tmp_path):
    np.savez(tmp_path / "obj.npz", **{"embedding/kernel": np.array([RunsCode(tmp_path / "x")], dtype=object)})
    with pytest.raises(ValueError, match="pickled Python objects"):
        read_checkpoint(tmp_path / "obj.npz")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("to,name", [("torchvision", "m.pth"), ("timm", "m.safetensors"), ("npz", "m.npz"),
                                     ("hf", "hf_folder/model.safetensors"), ("vitkit", "vk/model.safetensors")])
def test_truncated_files_get_a_clear_error(tmp_path, to, name):
    model = tiny()
    out = tmp_path / name
    target = out.parent if to in ("hf", "vitkit") else out
    save_weights(model, target, to, safetensors=(to == "timm"))
    data = out.read_bytes()
    for cut in (len(data) // 2, 100, 7):
        out.write_bytes(data[:cut])
        with pytest.raises(ValueError, match="truncated or corrupt|empty|not a weights file"):
            read_checkpoint(target)
    out.write_bytes(b"")
    with pytest.raises(ValueError, match="empty|truncated or corrupt"):
        read_checkpoint(target)


def test_legacy_torch_format_truncated(tmp_path):
    path = tmp_path / "legacy.pth"
    torch.save(tiny().state_dict(), path, _use_new_zipfile_serialization=False)
    assert read_checkpoint(path, num_heads=3).format == "timm"
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        read_checkpoint(path)


def test_wrong_layout_lists_recognised_and_unrecognised(tmp_path):
    state = {k: v for k, v in tiny().state_dict().items()}
    state["blocks.0.attn.q_norm.weight"] = torch.ones(64)  # timm's QK norm: another architecture
    del state["blocks.0.mlp.fc2.bias"]
    torch.save(state, tmp_path / "ls.pth")
    with pytest.raises(ValueError) as err:
        read_checkpoint(tmp_path / "ls.pth")
    msg = str(err.value)
    assert "recognised as the timm layout" in msg and "blocks.0.attn.q_norm.weight" in msg
    assert "blocks.0.mlp.fc2.bias" in msg

    resnet = {"conv1.weight": torch.zeros(64, 3, 7, 7), "bn1.weight": torch.zeros(64), "fc.weight": torch.zeros(10, 64)}
    torch.save(resnet, tmp_path / "resnet.pth")
    with pytest.raises(ValueError, match="no known ViT layout recognised.*conv1.weight"):
        read_checkpoint(tmp_path / "resnet.pth")

    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="not a weights file"):
        read_checkpoint(tmp_path / "notes.txt")
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pth")  # a whole pickled module, not a state dict
    with pytest.raises(ValueError, match="refused"):
        read_checkpoint(tmp_path / "module.pth")


def test_strict_loading_lists_keys_by_name(tmp_path):
    save_weights(tiny(), tmp_path / "m", "vitkit")
    other = vitkit.create_model("Ti/16", img_size=16, patch_size=4, depth=2, num_classes=3, mlp_dim=384)
    with pytest.raises(ValueError) as err:
        load_weights(tmp_path / "m", model=other)
    msg = str(err.value)
    assert "missing (12): blocks.1.norm1.weight" in msg
    assert "blocks.0.mlp.fc1.weight: [768, 192] vs model [384, 192]" in msg
