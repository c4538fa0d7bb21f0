"""torch.hub: ``torch.hub.load(ROOT, NAME, source="local")`` builds vitkit's models through hubconf.py at the
repository's root; pretrained weights come through vitkit's own loader (here from a cache folder we fill,
offline), and building without weights never opens a connection."""
import importlib.util
import socket
from pathlib import Path

import pytest
import torch

import vitkit
from _weights import randomize
from vitkit.checkpoints import save_weights
from vitkit.checkpoints.registry import KNOWN

ROOT = str(Path(__file__).resolve().parents[1])


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("torch.hub.load opened a network connection")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _hubconf():
    spec = importlib.util.spec_from_file_location("vitkit_hubconf", Path(ROOT) / "hubconf.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_entry_points_cover_the_names_vitkit_knows():
    hub = _hubconf()
    entries = {n for n in dir(hub) if not n.startswith("_") and callable(getattr(hub, n))}
    for name in ("vit_b_16", "vit_h_14", "vit_tiny_patch16_224", "vit_base_patch16_384", "vit_base_r50_s16_224",
                 "deit_tiny_distilled_patch16_224", "deit3_small_patch16_224", "vit_small_patch14_dinov2",
                 "vit_base_patch16_clip_224", "vit_base_patch16_siglip_224"):
        assert name in entries, name
    assert {e.model for e in KNOWN.values() if e.model.isidentifier()} <= entries  # every published model
    assert "vit_huge_patch14_384" not in entries  # 384 px is no multiple of patch 14: no such model
    assert all(getattr(hub, n).__doc__ and getattr(hub, n).__name__ == n for n in entries - {"Path"})


def test_hub_load_builds_without_network(no_network):
    m = torch.hub.load(ROOT, "vit_small_patch16_224", source="local", num_classes=10, img_size=32, depth=2)
    want = vitkit.create_model("vit_small_patch16_224", num_classes=10, img_size=32, depth=2)
    assert isinstance(m, vitkit.VisionTransformer) and m.config == want.config
    assert (m.config.width, m.config.num_heads, m.config.patch_size) == (384, 6, (16, 16))
    assert torch.hub.load(ROOT, "vit_b_16", source="local").num_params() == 86_567_656  # Table 1's B/16
    with pytest.raises(vitkit.ConfigError, match="unknown config field 'not_a_field'"):
        torch.hub.load(ROOT, "vit_b_16", source="local", not_a_field=1)


def test_hub_load_pretrained_goes_through_vitkits_loader(tmp_path, no_network):
    """pretrained=True: the weights published for the name (timm's DeiT-Ti distilled), read from the cache
    (offline) by vitkit's loader, in timm's layout, and computing what the model that wrote them computes."""
    torch.manual_seed(0)
    src = randomize(vitkit.create_model("deit_tiny_distilled_patch16_224")).eval()
    entry = KNOWN["timm/deit_tiny_distilled_patch16_224.fb_in1k"]
    save_weights(src, tmp_path / entry.file, to="timm", safetensors=True)
    m = torch.hub.load(ROOT, "deit_tiny_distilled_patch16_224", source="local", pretrained=True,
                       cache_dir=str(tmp_path), offline=True).eval()
    assert m.meta.source == str(tmp_path / entry.file) and len(m.meta.labels) == 1000  # the known entry's labels
    assert m.meta.preprocessing["name"] == "timm-imagenet"  # and its preset
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        want = src(x)
        torch.testing.assert_close(m(x), want, rtol=1e-5, atol=1e-5)
    assert want.std() > 0.1
