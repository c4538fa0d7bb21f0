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


def _labelled(model, name: str):
    """``model`` as it comes from a checkpoint that names its classes and preprocessing, adapted to 32 px."""
    from vitkit.data.preprocess import get_preset
    m = vitkit.create_model("Ti/16", img_size=32, patch_size=4, depth=2, num_classes=10, representation_size=64)
    m.load_state_dict(model.state_dict())
    m.meta.labels = [f"class {i}" for i in range(10)]
    m.meta.preprocessing = get_preset(name).to_dict()  # declared at 224 px; the model takes 32
    return m.eval()


def _check_metadata(props, model):
    """The exported metadata is the model's own: labels, the preset at the model's size, name, config."""
    from vitkit.data.preprocess import Preset
    assert json.loads(props["vitkit.labels"]) == model.meta.labels
    pre = Preset.from_dict(json.loads(props["vitkit.preprocessing"]))
    assert pre.size == (32, 32) and pre.resize == 36 and pre.mean == (0.485, 0.456, 0.406)  # 256/224 kept at 32
    assert props["vitkit.preprocessing_summary"] == ("torchvision IMAGENET1K_V1: shorter side 36 bilinear "
                                                     "(antialiased), centre crop 32, ImageNet mean/std")
    assert vitkit.ViTConfig.from_dict(json.loads(props["vitkit.config"])) == model.config
    assert props["vitkit.architecture"].startswith("ViT (width 192, depth 2, 3 heads, MLP 768, patch 4) at 32x32")
    assert json.loads(props["vitkit.input"])["shape"] == ["batch", 3, 32, 32]
    assert json.loads(props["vitkit.outputs"]) == {"logits": ["batch", 10]}


def test_onnx_carries_labels_and_preprocessing(model, tmp_path):
    pytest.importorskip("onnxruntime")
    import onnx
    import onnxruntime as ort
    m = _labelled(model, "torchvision")
    export_onnx(m, tmp_path / "m.onnx")
    _check_metadata({p.key: p.value for p in onnx.load(str(tmp_path / "m.onnx")).metadata_props}, m)
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    _check_metadata(sess.get_modelmeta().custom_metadata_map, m)  # what an onnxruntime user reads
    # a model without labels or preprocessing says so (null), not an empty or made-up value
    bare = vitkit.create_model("Ti/16", img_size=32, patch_size=4, depth=1, num_classes=0).eval()
    export_onnx(bare, tmp_path / "bare.onnx", features=True)
    props = {p.key: p.value for p in onnx.load(str(tmp_path / "bare.onnx")).metadata_props}
    assert props["vitkit.labels"] == "null" and props["vitkit.preprocessing"] == "null"
    assert json.loads(props["vitkit.outputs"]) == {"logits": ["batch", 192], "features": ["batch", 192]}


def test_openvino_carries_labels_and_preprocessing(model, tmp_path):
    pytest.importorskip("onnx")
    ov = pytest.importorskip("openvino")
    from vitkit.export import export_openvino
    m = _labelled(model, "torchvision")
    export_openvino(m, tmp_path / "ir")
    ir = ov.Core().read_model(str(tmp_path / "ir" / "model.xml"))
    keys = ("labels", "preprocessing", "preprocessing_summary", "config", "architecture", "input", "outputs")
    _check_metadata({f"vitkit.{k}": ir.get_rt_info(["vitkit", k]).astype(str) for k in keys}, m)
