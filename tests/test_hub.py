"""Hub ids through huggingface_hub, for real: HF_ENDPOINT points at a server on 127.0.0.1 that implements the
endpoints ``hf_hub_download`` calls, serving repositories we write (a Hugging Face ViT folder, and a timm
folder with only ``pytorch_model.bin``). The files land in huggingface_hub's cache under HF_HOME and are
found there again offline (HF_HUB_OFFLINE=1) with the server gone.

The commands run in a fresh interpreter because huggingface_hub reads HF_ENDPOINT and HF_HOME once, when
it is imported.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import vitkit
from _http_server import COMMIT, FileServer
from _weights import randomize
from vitkit.checkpoints import save_weights
from vitkit.models import kernel_plan as backend

pytest.importorskip("huggingface_hub")
SRC = str(Path(vitkit.__file__).resolve().parents[1])

SCRIPT = """
import json, sys, torch, vitkit
out = {}
for name in sys.argv[1:]:
    m = vitkit.load_weights(name, progress=False)
    torch.manual_seed(0)
    x = torch.randn(1, 3, 32, 32)
    out[name] = {"source": m.meta.source, "format": m.meta.format, "labels": m.meta.labels,
                 "pre": m.meta.preprocessing["name"], "logits": m(x)[0].tolist()}
print(json.dumps(out))
"""


def run(names, env, cwd):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *names], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)
    return proc


def folder_files(folder: Path):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_hub_ids_download_into_the_hf_cache_and_work_offline(tmp_path):
    torch.manual_seed(0)
    model = vitkit.create_model("Ti/16", img_size=32, depth=1, num_classes=3)
    randomize(model)
    model.meta.labels = ["cat", "dog", "cup"]
    hf = folder_files(save_weights(model, tmp_path / "hf", "hf"))
    timm = folder_files(save_weights(model, tmp_path / "timm", "timm"))
    from safetensors.torch import load_file
    buf = tmp_path / "pytorch_model.bin"
    torch.save(load_file(str(tmp_path / "timm" / "model.safetensors")), buf)
    timm = {"config.json": timm["config.json"], "pytorch_model.bin": buf.read_bytes()}
    names = ["acme/vit-tiny-test", "hf-hub:timm/vit_tiny_test.fake_in1k", "vit_tiny_test.fake_in1k@main"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(tmp_path / "hfhome"), PYTHONPATH=SRC, HF_HUB_DISABLE_TELEMETRY="1")
    # the online and offline processes are compared to the last bit: a fixed backend (unless the run fixes one),
    # else each process may measure its own GEMM library under load (not cached) and round differently
    env.setdefault(backend.ENV, backend.PLAIN.spec)
    torch.manual_seed(0)
    want = model.eval()(torch.randn(1, 3, 32, 32))[0]

    with FileServer() as server:
        server.repos["acme/vit-tiny-test"] = hf
        server.repos["timm/vit_tiny_test.fake_in1k"] = timm
        proc = run(names, dict(env, HF_ENDPOINT=server.url), tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        online = json.loads(proc.stdout.strip().splitlines()[-1])
        assert server.requests("/acme/vit-tiny-test/resolve/main/model.safetensors", "GET")
        assert server.requests("/timm/vit_tiny_test.fake_in1k/resolve/main/model.safetensors", "HEAD")  # 404
        assert server.requests("/timm/vit_tiny_test.fake_in1k/resolve/main/pytorch_model.bin", "GET")
        bad = subprocess.run([sys.executable, "-m", "vitkit", "inspect", "acme/no-such-repo"], capture_output=True,
                             text=True, env=dict(env, HF_ENDPOINT=server.url), cwd=tmp_path, timeout=120)
        assert bad.returncode == 1 and "acme/no-such-repo" in bad.stderr and "RepositoryNotFound" in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr

    for name in names:
        got = online[name]
        torch.testing.assert_close(torch.tensor(got["logits"]), want, rtol=1e-5, atol=1e-5)
    assert online[names[0]]["format"] == "hf" and online[names[0]]["labels"] == ["cat", "dog", "cup"]
    assert online[names[1]]["format"] == "timm" and online[names[1]]["pre"].startswith("timm")
    snap = tmp_path / "hfhome" / "hub" / "models--acme--vit-tiny-test" / "snapshots" / COMMIT
    assert (snap / "model.safetensors").read_bytes() == hf["model.safetensors"]
    assert online[names[0]]["source"] == str(snap)

    # the server is gone: offline, the same names are found in the cache
    proc = run(names, dict(env, HF_HUB_OFFLINE="1"), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == online
    proc = run(["acme/other-repo"], dict(env, HF_HUB_OFFLINE="1"), tmp_path)
    assert proc.returncode != 0 and "offline mode is on" in proc.stderr
    assert "/acme/other-repo/resolve/main/config.json" in proc.stderr and "acme--other-repo" in proc.stderr


@pytest.mark.peers
def test_a_repository_timm_downloaded_is_found_offline(tmp_path):
    """timm.create_model("hf-hub:...", pretrained=True) fills huggingface_hub's cache; vitkit then reads the
    same files offline, without a second copy, and computes the same logits."""
    pytest.importorskip("timm")
    torch.manual_seed(0)
    model = vitkit.create_model("Ti/16", img_size=32, depth=1, num_classes=3)
    randomize(model)
    files = folder_files(save_weights(model, tmp_path / "timm", "timm"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(tmp_path / "hfhome"), PYTHONPATH=SRC, HF_HUB_DISABLE_TELEMETRY="1")
    timm_script = ("import json, timm, torch; m = timm.create_model('hf-hub:timm/vit_tiny_test.fake_in1k', "
                   "pretrained=True).eval(); torch.manual_seed(0); x = torch.randn(1, 3, 32, 32); "
                   "print(json.dumps(m(x)[0].tolist()))")
    with FileServer() as server:
        server.repos["timm/vit_tiny_test.fake_in1k"] = files
        proc = subprocess.run([sys.executable, "-c", timm_script], env=dict(env, HF_ENDPOINT=server.url),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    proc = run(["hf-hub:timm/vit_tiny_test.fake_in1k"], dict(env, HF_HUB_OFFLINE="1"), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = json.loads(proc.stdout.strip().splitlines()[-1])["hf-hub:timm/vit_tiny_test.fake_in1k"]
    torch.testing.assert_close(torch.tensor(ours["logits"]), torch.tensor(theirs), rtol=1e-5, atol=1e-6)
    assert ours["source"] == str(tmp_path / "hfhome" / "hub" / "models--timm--vit_tiny_test.fake_in1k" / "snapshots"
                                 / COMMIT)  # timm's download, read where it is


def test_push_to_the_hub_and_load_back(tmp_path):
    """vitkit push (timm's folder, and transformers') to a loopback Hub: the repositories are created, one
    commit each, and what any loader then downloads from them computes the same logits."""
    torch.manual_seed(0)
    model = vitkit.create_model("Ti/16", img_size=32, depth=1, num_classes=3)
    randomize(model)
    model.meta.labels = ["cat", "dog", "cup"]
    save_weights(model, tmp_path / "w", "vitkit")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(tmp_path / "hfhome"), PYTHONPATH=SRC, HF_HUB_DISABLE_TELEMETRY="1", HF_TOKEN="hf_test")
    torch.manual_seed(0)
    want = model.eval()(torch.randn(1, 3, 32, 32))[0]
    with FileServer() as server:
        env["HF_ENDPOINT"] = server.url
        for repo, to in (("acme/ti-timm", "timm"), ("acme/ti-hf", "hf")):
            push = [sys.executable, "-m", "vitkit", "push", str(tmp_path / "w"), repo, "--to", to]
            calls = len(server.requests("/api/repos/create", "POST"))
            dry = subprocess.run(push + ["--dry-run", str(tmp_path / f"dry-{to}")], env=env, cwd=tmp_path,
                                 capture_output=True, text=True, timeout=120)
            assert dry.returncode == 0 and "nothing was uploaded" in dry.stdout, dry.stderr[-3000:]
            assert repo not in server.repos and len(server.requests("/api/repos/create", "POST")) == calls
            proc = subprocess.run(push, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert f"/{repo}/commit/{COMMIT}" in proc.stdout
            files = server.repos[repo]
            assert {"model.safetensors", "config.json", "README.md"} <= set(files)
            assert files == folder_files(tmp_path / f"dry-{to}")  # the dry run wrote exactly what was uploaded
            assert (f"library_name: {'timm' if to == 'timm' else 'transformers'}").encode() in files["README.md"]
            assert b"AutoModelForImageClassification.from_pretrained" in files["README.md"]
        assert server.requests("/api/repos/create", "POST") == [None, None]
        proc = run(["acme/ti-timm", "acme/ti-hf"], env, tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        back = json.loads(proc.stdout.strip().splitlines()[-1])
    assert back["acme/ti-timm"]["format"] == "timm" and back["acme/ti-hf"]["format"] == "hf"
    for name in back:
        assert back[name]["labels"] == ["cat", "dog", "cup"]
        torch.testing.assert_close(torch.tensor(back[name]["logits"]), want, rtol=1e-5, atol=1e-5)
