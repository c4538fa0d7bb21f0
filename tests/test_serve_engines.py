"""The engines of `vitkit serve` against eager PyTorch (each skipped with its reason where not installed),
`--engine auto`'s choice, and `vitkit export --to openvino`."""
import json

import numpy as np
import pytest
import torch

from _serve import tiny_model
from vitkit.checkpoints import save_model
from vitkit.cli import main
from vitkit.serve.engines import (
    TOLERANCE,
    EngineUnavailable,
    build_engine,
    choose_engine,
    installed,
    openvino_native_bf16,
)

INSTALLED = installed()


def _need(engine):
    if INSTALLED.get(engine) is None:
        extra = "onnx" if engine == "onnxruntime" else engine
        pytest.skip(f"{engine} is not installed (pip install 'vitkit[{extra}]')")


def _eager(model, x):
    with torch.no_grad():
        tokens = model.forward_features(x)
        return model.forward_head(tokens).numpy(), model.forward_head(tokens, pre_logits=True).numpy()


@pytest.mark.parametrize("engine", ["torch", "onnxruntime", "openvino"])
def test_engine_matches_eager_fp32(engine):
    _need(engine)
    model = tiny_model()
    x = torch.randn(5, 3, 32, 32)
    want_logits, want_feats = _eager(model, x)
    eng = build_engine(engine, model, "fp32")
    logits, feats = eng.run(x)
    np.testing.assert_allclose(logits, want_logits, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(feats, want_feats, atol=1e-4, rtol=1e-4)
    assert eng.info()["name"] == engine and eng.info()["dtype"] == "fp32"
    logits1, _ = eng.run(x[:1])  # the batch axis is dynamic
    np.testing.assert_allclose(logits1, want_logits[:1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("engine", ["onnxruntime", "openvino"])
def test_export_engines_leave_no_files(engine, tmp_path, monkeypatch):
    """An engine exports to a scratch folder and removes it once loaded: a server restarted many times (or a
    test suite) must not fill the disk with one export per start, and the engine keeps running after."""
    _need(engine)
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    model = tiny_model()
    eng = build_engine(engine, model, "fp32")
    assert list(tmp_path.iterdir()) == []
    x = torch.randn(2, 3, 32, 32)
    np.testing.assert_allclose(eng.run(x)[0], _eager(model, x)[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("engine,dtype", [("torch", "bf16"), ("torch", "int8"), ("openvino", "bf16")])
def test_engine_low_precision_within_tolerance(engine, dtype):
    _need(engine)
    if engine == "openvino" and not openvino_native_bf16():
        pytest.skip("this CPU has no native bf16 for OpenVINO")
    model = tiny_model()
    x = torch.randn(4, 3, 32, 32)
    want, _ = _eager(model, x)
    logits, _ = build_engine(engine, model, dtype).run(x)
    rel = np.abs(logits - want).max() / max(np.abs(want).max(), 1.0)
    assert rel <= TOLERANCE[dtype], rel


def test_engines_refuse_what_they_cannot_run():
    for engine, dtype in (("onnxruntime", "bf16"), ("onnxruntime", "int8"), ("openvino", "int8")):
        if INSTALLED.get(engine) is None:
            continue
        with pytest.raises(EngineUnavailable):
            build_engine(engine, tiny_model(), dtype)
    with pytest.raises(ValueError, match="unknown engine"):
        build_engine("tensorrt", tiny_model())


def test_auto_picks_the_fastest_checked_engine():
    engine, report = choose_engine(tiny_model(), "auto", "fp32", batch=4, budget_s=0.1)
    rows = {r["engine"]: r for r in report["candidates"]}
    assert set(rows) == {"torch", "onnxruntime", "openvino"}
    timed = {name: r["img_per_s"] for name, r in rows.items() if "img_per_s" in r}
    for name, version in INSTALLED.items():
        if version is None:
            assert "not installed" in rows[name]["skipped"]
        else:
            assert rows[name]["ok"] and rows[name]["rel_diff"] <= TOLERANCE["fp32"] and name in timed
    assert engine.name == report["chosen"] == max(timed, key=timed.get)


def test_named_engine_is_checked_and_bf16_auto_skips_fp32_only_engines():
    engine, report = choose_engine(tiny_model(), "torch", "fp32", batch=2, budget_s=0)
    assert engine.name == "torch" and report["candidates"][0]["ok"] and "img_per_s" not in report["candidates"][0]
    engine, report = choose_engine(tiny_model(), "auto", "bf16", batch=2, budget_s=0.02)
    rows = {r["engine"]: r for r in report["candidates"]}
    if INSTALLED["onnxruntime"]:
        assert "fp32 only" in rows["onnxruntime"]["skipped"]
    assert engine.dtype == "bf16"


def test_export_to_openvino_matches_eager(tmp_path, capsys):
    _need("openvino")
    import openvino as ov

    model = tiny_model()
    folder = save_model(model, tmp_path / "ckpt")
    assert main(["export", str(folder), str(tmp_path / "ir" / "m.xml"), "--to", "openvino"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == "openvino" and report["max_abs_diff"] < 1e-4 and report["batch"] == 3
    assert (tmp_path / "ir" / "m.bin").is_file()
    compiled = ov.Core().compile_model(str(tmp_path / "ir" / "m.xml"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    x = torch.randn(6, 3, 32, 32)
    got = compiled(x.numpy())[0]
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), atol=1e-4, rtol=1e-4)
    # a folder gets model.xml / model.bin
    from vitkit.export import openvino_paths
    assert openvino_paths(tmp_path / "irdir") == (tmp_path / "irdir" / "model.xml", tmp_path / "irdir" / "model.bin")
