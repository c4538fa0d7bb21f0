"""Downloads for real, offline: a server on 127.0.0.1 (tests/_http_server.py) serves checkpoints we make.

Plain URL, torchvision-style hash prefix checked, mismatch refused, an interrupted download resumed with a
Range request, a server without ranges, server errors, offline mode, files honouring the umask, and the
caches (TORCH_HOME) shared with torchvision and timm. Nothing here replaces the download functions.
"""
import hashlib
import os
import stat

import pytest
import torch

import vitkit
from _http_server import FileServer
from _weights import randomize
from vitkit.checkpoints import WeightsUnavailable, download_url, load_weights, resolve_weights, save_weights
from vitkit.cli import main


@pytest.fixture(scope="module")
def tv_bytes(tmp_path_factory):
    """A small torchvision-layout checkpoint (random weights) as bytes, and the model it came from."""
    torch.manual_seed(0)
    model = randomize(vitkit.create_model("Ti/16", img_size=32, depth=1, num_classes=10))
    path = save_weights(model, tmp_path_factory.mktemp("src") / "tv.pth", "torchvision")
    return path.read_bytes(), model


@pytest.fixture
def server():
    with FileServer() as s:
        yield s


def files(folder):
    """What a folder holds besides the download locks."""
    return sorted(p.name for p in folder.iterdir() if p.name != ".locks")


def named(data: bytes, stem: str = "vit_tiny") -> str:
    return f"/models/{stem}-{hashlib.sha256(data).hexdigest()[:8]}.pth"


def test_url_download_into_torch_home_checked_and_cached(server, tv_bytes, tmp_path, monkeypatch, capsys):
    data, model = tv_bytes
    path = named(data)
    server.files[path] = data
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    old = os.umask(0o022)
    try:
        m = load_weights(server.url + path, progress=False)
    finally:
        os.umask(old)
    cached = tmp_path / "torch" / "hub" / "checkpoints" / path.rsplit("/", 1)[1]
    assert cached.read_bytes() == data and stat.S_IMODE(cached.stat().st_mode) == 0o644
    assert not list(cached.parent.glob("*.part"))
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(m(x), model.eval()(x), rtol=0, atol=0)
    assert m.meta.format == "torchvision" and m.meta.preprocessing["name"] == "torchvision"
    assert any(server.url + path in n for n in m.meta.notes)
    n = len(server.log)
    load_weights(server.url + path, progress=False)  # found in the cache: no second request
    assert main(["weights", "--download", server.url + path]) == 0  # the CLI's way: says where it is
    assert len(server.log) == n and capsys.readouterr().out.strip() == str(cached)


def test_hash_prefix_mismatch_is_refused_and_nothing_is_kept(server, tv_bytes, tmp_path):
    data, _ = tv_bytes
    server.files["/models/vit_tiny-deadbeef.pth"] = data
    with pytest.raises(ValueError, match="SHA-256 .* does not match the published deadbeef"):
        download_url(server.url + "/models/vit_tiny-deadbeef.pth", tmp_path / "w.pth", progress=False)
    assert files(tmp_path) == []
    good = hashlib.sha256(data).hexdigest()
    server.files["/w.pth"] = data  # a full digest given explicitly
    assert download_url(server.url + "/w.pth", tmp_path / "w.pth", sha256=good, progress=False).read_bytes() == data


def test_interrupted_download_resumes_with_a_range_request(server, tv_bytes, tmp_path):
    data, _ = tv_bytes
    server.files["/big.pth"] = data
    server.cut_once.add("/big.pth")
    dst = tmp_path / "big.pth"
    with pytest.raises(WeightsUnavailable) as err:
        download_url(server.url + "/big.pth", dst, progress=False, retries=0)
    part = tmp_path / "big.pth.part"
    half = len(data) // 2
    assert part.stat().st_size == half and not dst.exists()
    assert "the next try resumes" in str(err.value) and str(dst) in str(err.value)
    assert download_url(server.url + "/big.pth", dst, progress=False).read_bytes() == data
    assert server.requests("/big.pth") == [None, f"bytes={half}-"] and not part.exists()
    # within one call: the cut is retried at once, from where it stopped
    server.cut_once.add("/big.pth")
    again = download_url(server.url + "/big.pth", tmp_path / "again.pth", progress=False, retries=1)
    assert again.read_bytes() == data and server.requests("/big.pth")[-2:] == [None, f"bytes={half}-"]


def test_server_without_ranges_and_stale_part(server, tv_bytes, tmp_path):
    data, _ = tv_bytes
    server.files["/whole.pth"] = data
    server.no_range.add("/whole.pth")
    (tmp_path / "whole.pth.part").write_bytes(b"x" * 100)  # the server answers 200: the part is discarded
    assert download_url(server.url + "/whole.pth", tmp_path / "whole.pth", progress=False).read_bytes() == data
    (tmp_path / "w2.pth.part").write_bytes(data + b"extra")  # longer than the file: 416, start over
    server.files["/w2.pth"] = data
    assert download_url(server.url + "/w2.pth", tmp_path / "w2.pth", progress=False).read_bytes() == data


def test_server_errors_name_the_url_and_the_path(server, tmp_path):
    server.status["/broken.pth"] = 500
    dst = tmp_path / "broken.pth"
    with pytest.raises(WeightsUnavailable) as err:
        download_url(server.url + "/broken.pth", dst, progress=False, retries=1)
    msg = str(err.value)
    assert "HTTP 500" in msg and server.url + "/broken.pth" in msg and f"save it as {dst}" in msg
    assert len(server.requests("/broken.pth")) == 2  # 5xx is retried, then reported
    with pytest.raises(WeightsUnavailable, match="HTTP 404"):
        download_url(server.url + "/missing.pth", tmp_path / "m.pth", progress=False, retries=3)
    assert len(server.requests("/missing.pth")) == 1  # 404 is not retried
    assert files(tmp_path) == []


def test_offline_mode_asks_nothing_and_says_where_to_put_the_file(server, tv_bytes, tmp_path, monkeypatch, capsys):
    data, _ = tv_bytes
    server.files["/o.pth"] = data
    with pytest.raises(WeightsUnavailable, match="offline mode") as err:
        resolve_weights(server.url + "/o.pth", cache_dir=tmp_path, offline=True)
    assert str(tmp_path / "o.pth") in str(err.value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(WeightsUnavailable):
        resolve_weights(server.url + "/o.pth", cache_dir=tmp_path)
    img = tmp_path / "img.png"
    from PIL import Image
    Image.new("RGB", (40, 30), (200, 30, 30)).save(img)
    assert main(["predict", str(img), "-w", server.url + "/o.pth", "--offline"]) == 1
    assert "offline mode" in capsys.readouterr().err
    assert server.log == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert resolve_weights(server.url + "/o.pth", cache_dir=tmp_path, progress=False).path.read_bytes() == data
    # once cached, offline works
    assert resolve_weights(server.url + "/o.pth", cache_dir=tmp_path, offline=True).path == tmp_path / "o.pth"


def test_known_torchvision_name_downloads_from_its_url_and_checks_the_hash(server, tv_bytes, tmp_path):
    """A known entry's published hash prefix is checked: our stand-in file is not torchvision's."""
    from vitkit.checkpoints.registry import get_known
    from vitkit.checkpoints.sources import fetch_known

    data, _ = tv_bytes
    entry = get_known("ViT_B_16_Weights.DEFAULT")
    assert entry.name == "torchvision/vit_b_16" and get_known("ViT_B_16_Weights.IMAGENET1K_V1") is entry
    import dataclasses
    local = dataclasses.replace(entry, url=server.url + "/models/" + entry.file)
    server.files["/models/" + entry.file] = data
    with pytest.raises(ValueError, match="c867db91"):
        fetch_known(local, tmp_path, None, False)
    assert not (tmp_path / entry.file).exists()


def test_a_file_torchvision_downloaded_is_found_without_a_second_copy(server, tv_bytes, tmp_path, monkeypatch):
    """torchvision fetches weights with torch.hub.load_state_dict_from_url into TORCH_HOME/hub/checkpoints;
    vitkit looks there first, so the same URL is read from that file, even offline."""
    data, model = tv_bytes
    path = named(data, "vit_tv")
    server.files[path] = data
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "th"))
    state = torch.hub.load_state_dict_from_url(server.url + path, progress=False, check_hash=True)
    assert "conv_proj.weight" in state and len(server.log) == 1
    m = load_weights(server.url + path, offline=True)
    assert len(server.log) == 1 and m.meta.source == str(tmp_path / "th" / "hub" / "checkpoints" / path[8:])
    assert torch.equal(m.patch_embed.proj.weight, state["conv_proj.weight"])
    assert len(list((tmp_path / "th").rglob("*.pth"))) == 1


def test_concurrent_downloads_of_one_file_fetch_it_once(server, tv_bytes, tmp_path):
    import threading

    data, _ = tv_bytes
    server.files["/shared.pth"] = data
    out, errors = [], []

    def fetch():
        try:
            out.append(download_url(server.url + "/shared.pth", tmp_path / "shared.pth", progress=False))
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=fetch) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and len(out) == 4 and (tmp_path / "shared.pth").read_bytes() == data
    assert len(server.requests("/shared.pth")) == 1 and files(tmp_path) == ["shared.pth"]
