"""load_weights: adaptation at load time, known names, return_state for training; convert from the CLI."""
import json

import pytest
import torch

import vitkit
from _weights import randomize
from vitkit.checkpoints import KNOWN, convert, get_known, load_weights, read_checkpoint, save_model, save_weights
from vitkit.checkpoints.download import check_sha256
from vitkit.checkpoints.sources import resolve_weights
from vitkit.cli import main
from vitkit.config import config_from_name
from vitkit.data.preprocess import PRESETS, get_preset
from vitkit.models.posemb import resize_pos_embed


@pytest.fixture
def trained(tmp_path):
    model = randomize(vitkit.create_model("Ti/16", img_size=32, patch_size=4, depth=2, num_classes=4,
                                          representation_size=96))
    folder = save_model(model, tmp_path / "m", labels=["a", "b", "c", "d"], preprocessing=get_preset("hf", 32))
    return model, folder


def test_adaptation_resolution_classes_pre_logits(trained):
    model, folder = trained
    same = load_weights(folder)
    assert same.meta.labels == ["a", "b", "c", "d"] and same.meta.preprocessing["size"] == [32, 32]
    big = load_weights(folder, img_size=48)  # grid 8x8 -> 12x12, authors' bilinear
    torch.testing.assert_close(big.pos_embed, resize_pos_embed(model.pos_embed, (8, 8), (12, 12), 1, "bilinear"))
    assert big.meta.preprocessing["size"] == [48, 48] and big.meta.labels == same.meta.labels
    assert big(torch.randn(1, 3, 48, 48)).shape == (1, 4)
    new = load_weights(folder, num_classes=7, representation_size=None, labels=list("abcdefg"))
    assert new.config.representation_size is None and not hasattr(new.pre_logits, "fc")
    assert torch.count_nonzero(new.head.weight) == 0 and new.meta.labels == list("abcdefg")
    assert any("head re-initialised" in n for n in new.meta.notes)
    kept = load_weights(folder, num_classes=7)  # pre-logits kept: the head is replaced on top of it
    assert kept.config.representation_size == 96 and kept.meta.labels is None
    torch.testing.assert_close(kept.pre_logits.fc.weight, model.pre_logits.fc.weight)
    tuned = load_weights(folder, drop_path=0.1, dropout=0.1)  # training-time fields pass through
    assert tuned.config.drop_path == 0.1


def test_return_state_for_training_and_load_into_model(trained):
    model, folder = trained
    state, cfg = load_weights(folder, return_state=True, num_classes=10, representation_size=None)
    assert cfg.num_classes == 10 and state["head.weight"].shape == (10, 192)
    target = vitkit.VisionTransformer(cfg)
    target.load_state_dict(state)  # strict: nothing missing, nothing extra
    for k, v in model.state_dict().items():  # the backbone is the checkpoint's; head and pre-logits are not
        if not k.startswith(("head.", "pre_logits.")):
            assert torch.equal(state[k], v), k
    into = vitkit.VisionTransformer(cfg.replace(img_size=64))
    out = load_weights(folder, model=into, representation_size=None)
    assert out is into and out.pos_embed.shape == (1, 1 + 16 * 16, 192)
    # loaded into a 64 px model: the 8x8 table resized to 16x16 (the authors' bilinear), blocks as saved
    torch.testing.assert_close(out.pos_embed, resize_pos_embed(model.pos_embed, (8, 8), (16, 16), 1, "bilinear"))
    assert torch.equal(out.blocks[1].attn.qkv.weight, model.blocks[1].attn.qkv.weight)


def test_known_names_say_what_to_fetch(tmp_path):
    entry = get_known("torchvision/vit_b_16")
    assert entry.top1 == 81.072 and entry.params == 86567656 and entry.sha256 == "c867db91"
    with pytest.raises(FileNotFoundError) as err:
        load_weights("torchvision/vit_b_16", cache_dir=tmp_path, offline=True)
    msg = str(err.value)
    assert "https://download.pytorch.org/models/vit_b_16-c867db91.pth" in msg
    assert str(tmp_path / "vit_b_16-c867db91.pth") in msg
    with pytest.raises(FileNotFoundError, match="did you mean torchvision/vit_b_16"):
        load_weights("torchvision/vit_b16")
    for e in KNOWN.values():  # every entry is consistent with the model it names
        cfg = config_from_name(e.model)
        assert (e.preset in PRESETS or not e.preset and e.hub_repo) and e.img_size % cfg.patch_size[0] == 0
        if e.params and e.source in ("torchvision", "timm"):
            c = vitkit.cost(cfg.replace(img_size=e.img_size, num_classes=e.num_classes,
                                        representation_size=e.representation_size))
            assert c.params == e.params, e.name


def test_known_name_with_local_file_and_hash(tmp_path):
    tv = vitkit.create_model("B/16", img_size=32, patch_size=16, depth=1, num_classes=1000)
    path = save_weights(tv, tmp_path / "vit_b_16-c867db91.pth", "torchvision")
    entry = get_known("torchvision/vit_b_16")
    assert resolve_weights("ViT_B_16_Weights.IMAGENET1K_V1", cache_dir=tmp_path, offline=True).path == path
    m = load_weights("torchvision/vit_b_16", cache_dir=tmp_path)
    assert m.meta.preprocessing["name"] == "torchvision" and m.meta.labels[0] == "tench"
    with pytest.raises(ValueError, match="SHA-256"):  # our stand-in is not the published file
        check_sha256(path, entry.sha256, str(path))
    with pytest.raises(ValueError, match="SHA-256"):
        load_weights("torchvision/vit_b_16", cache_dir=tmp_path, check_hash=True)


def test_cli_convert_and_inspect(trained, tmp_path, capsys):
    _, folder = trained
    for to, dst in (("npz", "m.npz"), ("torchvision", "m.pth"), ("timm", "m.safetensors"), ("vitkit", "back")):
        args = ["convert", str(folder if to != "vitkit" else tmp_path / "m.npz"), str(tmp_path / dst), "--to", to]
        if to == "timm":
            args.append("--safetensors")
        assert main(args) == 0
    back = read_checkpoint(tmp_path / "back")
    orig = read_checkpoint(folder)
    assert all(torch.equal(back.state[k], v) for k, v in orig.state.items())  # vitkit -> npz -> vitkit
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "m.pth"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "torchvision" and info["config"]["depth"] == 2
    assert main(["convert", str(folder), str(tmp_path / "x"), "--to", "hf"]) == 1  # pre-logits + head: refused
    assert "cannot be written as an HF folder" in capsys.readouterr().err


def test_cli_weights_table(capsys):
    assert main(["weights"]) == 0
    out = capsys.readouterr().out
    assert "torchvision/vit_h_14-swag-e2e" in out and "88.55" in out
    assert main(["weights", "vit_jax/ViT-B_16-i21k"]) == 0
    entry = json.loads(capsys.readouterr().out)
    assert entry["num_classes"] == 21843 and entry["url"].endswith("imagenet21k/ViT-B_16.npz")


def test_convert_to_unknown_format(trained, tmp_path):
    _, folder = trained
    with pytest.raises(ValueError, match="use one of vitkit, npz, torchvision, timm, hf"):
        convert(folder, tmp_path / "x", "keras")


def test_known_timm_name_finds_the_downloaded_repository_folder(tmp_path):
    """A known timm checkpoint is found as its file or as its whole Hub repository folder (config.json +
    model.safetensors, as a download of timm/... gives); the error names both."""
    name = "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k"
    with pytest.raises(FileNotFoundError) as err:
        load_weights(name, cache_dir=tmp_path, offline=True)
    msg = str(err.value)  # the address of the file and the folder to save the repository in
    assert "/timm/vit_base_patch16_224.augreg2_in21k_ft_in1k/resolve/main/config.json" in msg and "offline" in msg
    assert str(tmp_path / "vit_base_patch16_224.augreg2_in21k_ft_in1k") in msg
    small = vitkit.create_model("B/16", img_size=32, depth=1, num_classes=1000)
    repo = save_weights(small, tmp_path / "vit_base_patch16_224.augreg2_in21k_ft_in1k", "timm")
    assert resolve_weights("hf-hub:" + name, cache_dir=tmp_path, offline=True).path == repo
    m = load_weights(name, cache_dir=tmp_path)
    assert m.meta.preprocessing["name"] == "timm" and m.config.depth == 1 and m.meta.labels[0] == "tench"
