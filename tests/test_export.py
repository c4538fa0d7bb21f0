"""Export: ONNX (run by onnxruntime) and torch.export give eager PyTorch's logits (fp32, atol 1e-4)."""
import json

import pytest
import torch

import vitkit
from _weights import randomize
from vitkit.checkpoints import save_model
from vitkit.cli import main
from vitkit.export import export_onnx, export_program


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = vitkit.create_model("Ti/16", img_size=32, patch_size=4, depth=2, num_classes=10, representation_size=64)
    randomize(m)
    return m.eval()


def test_onnx_matches_eager_with_dynamic_batch(model, tmp_path):
    pytest.importorskip("onnxruntime")
    report = export_onnx(model, tmp_path / "m.onnx")
    assert report["validated"].startswith("onnxruntime") and report["batch"] == 3  # traced at 2, run at 3
    assert report["max_abs_diff"] < 1e-4
    import onnx
    import onnxruntime as ort
    graph = onnx.load(str(tmp_path / "m.onnx")).graph
    assert [i.name for i in graph.input] == ["pixels"] and [o.name for o in graph.output] == ["logits"]
    # run here, not only by the exporter's own check: another batch size, other images
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    x = torch.randn(5, 3, 32, 32)
    with torch.no_grad():
        want = model(x)
    got = torch.from_numpy(sess.run(["logits"], {"pixels": x.numpy()})[0])
    assert want.std() > 0.1  # logits that vary with the image (the zero head was replaced)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_torch_export_matches_eager(model, tmp_path):
    report = export_program(model, tmp_path / "m.pt2")
    assert report["max_abs_diff"] < 1e-4 and report["batch"] == 3
    program = torch.export.load(str(tmp_path / "m.pt2")).module()
    x = torch.randn(5, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(program(x), model(x), rtol=1e-5, atol=1e-5)


def test_cli_export(model, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    folder = save_model(model, tmp_path / "ckpt")
    assert main(["export", str(folder), str(tmp_path / "m.onnx"), "--img-size", "48"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == "onnx" and report["max_abs_diff"] < 1e-4
    import onnxruntime as ort
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    x = torch.randn(2, 3, 48, 48)
    got = torch.from_numpy(sess.run(None, {"pixels": x.numpy()})[0])
    # the checkpoint loaded at 48 px (position table resized 8x8 -> 12x12), computed by eager PyTorch
    from vitkit.checkpoints import load_weights
    with torch.no_grad():
        want = load_weights(folder, img_size=48).eval()(x)
    assert got.shape == (2, 10)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
