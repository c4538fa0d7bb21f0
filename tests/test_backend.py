"""The declared backend (vitkit.models.backend): parsing, precedence, recording, graph consumers on the plain
path whatever is declared, every fixed value giving the same function, and bit-identical repeats."""
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from _weights import randomize
from vitkit.cli import main
from vitkit.models import backend, kernels
from vitkit.models.backend import Backend, use_backend
from vitkit.models.cost import cost

FIXED = ["gemm=aten,attention=fused", "gemm=aten,attention=explicit", "gemm=onednn,attention=fused",
         "gemm=onednn,attention=explicit"]


def noisy_model(cfg, std=0.1):
    return randomize(vitkit.VisionTransformer(cfg), std)


def test_parse_spec_and_errors(monkeypatch):
    assert Backend.parse("") == Backend.parse("auto") == Backend() == backend.AUTO
    b = Backend.parse("gemm=onednn, attention=explicit")
    assert (b.gemm, b.attention, b.int8) == ("onednn", "explicit", "auto") and not b.fixed
    assert Backend.parse(b.spec) == b and b.pinned() == Backend("onednn", "explicit", backend.PLAIN.int8)
    assert b.pinned().fixed
    with pytest.raises(ValueError, match="gemm='mkl' is not one of auto, aten, onednn"):
        Backend.parse("gemm=mkl")
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        Backend.parse("threads=4")
    monkeypatch.setenv(backend.ENV, "attention=flash")
    with pytest.raises(ValueError, match="VITKIT_BACKEND='attention=flash'"):
        backend.current()


def test_precedence_context_over_setting_over_environment(monkeypatch):
    monkeypatch.setenv(backend.ENV, "gemm=onednn")
    assert backend.current().gemm == "onednn" and backend.record()["source"] == backend.ENV
    try:
        backend.set_backend("gemm=aten")
        assert backend.current().gemm == "aten" and backend.record()["source"] == "set_backend"
        with use_backend(attention="explicit") as b:  # changes one field, keeps the rest in force
            assert b == backend.current() == Backend("aten", "explicit")
            with use_backend("gemm=onednn,int8=x86"):
                assert backend.current() == Backend("onednn", "auto", "x86")
            assert backend.current() == Backend("aten", "explicit")
        assert backend.current() == Backend("aten")
    finally:
        backend.set_backend(None)
    assert backend.current().gemm == "onednn"
    monkeypatch.delenv(backend.ENV)
    assert backend.current() == backend.AUTO and backend.record()["source"] == "default"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("training", [False, True])
def test_every_fixed_backend_computes_the_same_function(tiny_cfg, dtype, training):
    """The logits and (in training) every gradient agree across the fixed backends: fp32 to rounding, bf16 to
    bf16 rounding (the explicit path rounds the attention weights to bf16 before AV, the fused kernel does not)."""
    if dtype == torch.bfloat16 and not backend.cpu_has_native_bf16():
        pytest.skip("bf16 runs widened to fp32 here: the fixed paths are covered by the fp32 case")
    base = noisy_model(tiny_cfg.replace(class_token=False, pool="gap")).to(dtype)
    x = torch.randn(4, 3, 32, 32).to(dtype)
    results = {}
    for spec in FIXED:
        if "onednn" in spec and not kernels.onednn_ok(dtype):
            continue
        model = base.train() if training else base.eval()
        model.zero_grad()
        with use_backend(spec):
            if training:
                out = model(x)
                out.float().square().mean().backward()
                grads = [p.grad.float().clone() for p in model.parameters()]
            else:
                with torch.inference_mode():
                    out = model(x)
                grads = []
        results[spec] = (out.detach().float(), grads)
    ref_out, ref_grads = results[FIXED[0]]
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for spec, (out, grads) in results.items():
        err = ((out - ref_out).abs().max() / ref_out.abs().max()).item()
        assert err < tol, (spec, err)
        for g, r in zip(grads, ref_grads):
            if r.abs().max() > 0:
                assert ((g - r).norm() / r.norm()).item() < (1e-4 if dtype == torch.float32 else 5e-2), spec


@pytest.mark.parametrize("gelu", ["exact", "tanh"])
def test_the_mlp_first_layer_and_its_gelu_are_one_call_on_the_declared_kernel(gelu, monkeypatch):
    """In inference fc1 and its GELU run as one ``linear_gelu`` call: ATen's addmm then GELU in place, or oneDNN's
    linear with the GELU fused; both equal the module-by-module MLP, and the declared kernel is the one used."""
    import torch.nn.functional as F

    from vitkit.models.layers import Mlp

    if not kernels.onednn_ok(torch.float32):
        pytest.skip("oneDNN's linear primitive is not available in this torch build")
    torch.manual_seed(0)
    mlp = Mlp(16, 64, gelu).eval()
    x = torch.randn(2, 5, 16)
    approx = "tanh" if gelu == "tanh" else "none"
    ref = F.linear(F.gelu(F.linear(x, mlp.fc1.weight, mlp.fc1.bias), approximate=approx), mlp.fc2.weight,
                   mlp.fc2.bias).detach()
    used = []
    real = kernels._gemm_gelu
    monkeypatch.setattr(kernels, "_gemm_gelu", lambda kern, *a: used.append((kern, a[-1])) or real(kern, *a))
    for gemm in ("aten", "onednn"):
        with use_backend(gemm=gemm), torch.inference_mode():
            out = mlp(x)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    assert used == [("aten", approx), ("onednn", approx)]


def test_the_encoder_library_is_timed_on_blocks_of_the_model_shape_and_used_by_every_product(tiny_cfg, monkeypatch,
                                                                                           fresh_cache):
    """Under gemm=auto a model's encoder products in inference run on the library that ran blocks of its shape
    faster (measured once, cached, recorded); a declared library skips the timing; training is untouched."""
    from vitkit.models import tune

    if not kernels.onednn_ok(torch.float32):
        pytest.skip("oneDNN's linear primitive is not available in this torch build")
    timed = tune.measure_blocks(torch.float32, 32, 2, 64, tokens=17, images=2, rounds=1, depth=2)  # the real timing
    assert timed["aten_s"] > 0 and timed["onednn_s"] > 0 and timed["shape"]["tokens"] == 17
    ratio = {"value": 2.0}
    calls = []
    monkeypatch.setattr(tune, "measure_blocks", lambda *a, **k: calls.append(a) or {"ratio": ratio["value"]})
    used = []
    real = kernels._gemm
    monkeypatch.setattr(kernels, "_gemm", lambda kern, *a: used.append(kern) or real(kern, *a))
    model = noisy_model(tiny_cfg).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        ref = model(x)
    assert len(calls) == 1 and set(used) == {"onednn"}  # every product of the encoder on the faster library
    what = [w for w in backend.decisions() if w.startswith("gemm encoder float32")]
    assert len(what) == 1 and backend.decisions()[what[0]]["choice"] == "onednn"
    used.clear()
    with torch.inference_mode():
        torch.testing.assert_close(model(x), ref, rtol=1e-5, atol=1e-5)  # decided: no second timing
    assert len(calls) == 1 and set(used) == {"onednn"}
    tune.forget()
    ratio["value"] = 1.0
    with torch.inference_mode():
        model(x)
    assert len(calls) == 1  # read back from the cache file, not timed again
    backend.forget()
    backend.write_cache(backend.cache_key(what[0]), {"choice": "bogus"})  # a damaged entry: timed again
    used.clear()
    with torch.inference_mode():
        model(x)
    assert len(calls) == 2 and "onednn" not in used  # 1.0 < MIN_GAIN: ATen
    used.clear()
    with use_backend(gemm="onednn"), torch.inference_mode():
        model(x)
    assert len(calls) == 2 and set(used) == {"onednn"}  # declared: no timing
    used.clear()
    with torch.enable_grad():
        model.train()(x).sum().backward()  # training: F.linear / the training products, never the encoder choice
    assert len(calls) == 2


@pytest.mark.parametrize("training", [False, True])
def test_auto_compiles_as_one_graph_and_keeps_the_settled_attention(tiny_cfg, training, fresh_cache, monkeypatch):
    """Under auto, torch.compile sees the whole model as one graph (no probe, thread count or timing traced), and
    the attention path the process settled before compiling is the one in the graph."""
    import torch._dynamo as dynamo

    from vitkit.models import precision

    model = noisy_model(tiny_cfg).train(training)
    x = torch.randn(2, 3, 32, 32)
    monkeypatch.setattr(precision, "_decide_attention", lambda q, k, grad: ({"ratio": 2.0}, "explicit"))
    assert precision.settle_attention(tiny_cfg, torch.float32, grad=training) == "explicit"
    ran = []
    real = precision._run_path
    monkeypatch.setattr(precision, "_run_path", lambda path, *a: ran.append(path) or real(path, *a))
    with torch.set_grad_enabled(training):
        explained = dynamo.explain(model)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert ran and set(ran) == {"explicit"}


@pytest.mark.parametrize("spec", FIXED)
def test_graph_consumers_get_the_plain_path_whatever_is_declared(tiny_cfg, spec, tmp_path):
    """ONNX export, torch.export, torch.compile (a full graph), TorchScript tracing and the FLOP counter work
    under every declared backend (the oneDNN products are not ops they know: they get ATen's)."""
    from vitkit.export import export_onnx, export_program

    model = noisy_model(tiny_cfg).eval()
    x = torch.randn(2, 3, 32, 32)
    with use_backend(spec):
        ref = model(x).detach()
        with FlopCounterMode(display=False) as fc, torch.no_grad():
            model(x, return_attention=True)
        assert fc.get_total_flops() == 2 * 2 * cost(tiny_cfg).macs
        with torch.no_grad():
            traced = torch.jit.trace(model, (x,), strict=False, check_trace=False)
        torch.testing.assert_close(traced(x), ref, rtol=1e-5, atol=1e-5)
        assert "mkldnn" not in str(traced.graph)
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)  # dynamo + AOT autograd, no C++
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), ref, rtol=1e-5, atol=1e-5)
        pytest.importorskip("onnxruntime")
        rep = export_onnx(model, tmp_path / "m.onnx")
        assert rep["max_abs_diff"] < 1e-4
        rep = export_program(model, tmp_path / "m.pt2")
        assert rep["max_abs_diff"] < 1e-4


def _fingerprint(spec: str) -> str:
    code = (
        "import hashlib, torch, vitkit\n"
        "from vitkit.models.backend import use_backend\n"
        "torch.manual_seed(0)\n"
        "m = vitkit.create_model('Ti/16', img_size=32, patch_size=8, depth=2, num_classes=5)\n"
        "for p in m.parameters():\n"
        "    torch.nn.init.normal_(p, std=0.1)\n"
        "x = torch.randn(3, 3, 32, 32)\n"
        "h = hashlib.sha256()\n"
        f"with use_backend({spec!r}):\n"
        "    out = m(x); out.square().sum().backward()\n"
        "    h.update(out.detach().numpy().tobytes())\n"
        "    for p in m.parameters(): h.update(p.grad.numpy().tobytes())\n"
        "    with torch.inference_mode(): h.update(m.eval()(x).numpy().tobytes())\n"
        "print(h.hexdigest())\n")
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop(backend.ENV, None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("spec", ["gemm=aten,attention=fused", "gemm=onednn,attention=explicit"])
def test_results_are_identical_to_the_last_bit_when_the_backend_is_fixed(spec):
    """Two processes on one machine, the same fixed backend: logits, gradients and inference logits hash equal."""
    assert _fingerprint(spec) == _fingerprint(spec)


def test_choices_are_recorded_and_reports_never_measure(tiny_cfg, tmp_path, monkeypatch):
    monkeypatch.delenv(backend.ENV, raising=False)
    backend.set_cache_file(tmp_path / "kernels.json")
    backend.forget()
    try:
        assert kernels.summary(torch.float32)["linear"]["why"] in ("not measured yet", "only ATen runs this dtype here")
        on_gpu = kernels.summary(torch.float32, "cuda")["linear"]
        assert on_gpu["kernel"] == "aten" and on_gpu["why"].startswith("off the CPU (cuda)")
        assert not (tmp_path / "kernels.json").exists() and backend.decisions() == {}
        model = noisy_model(tiny_cfg).eval()
        with torch.inference_mode():
            model(torch.randn(1, 3, 32, 32))  # the first call that needs a choice measures it
        made = backend.decisions()
        assert any(k.startswith("attention float32 inference") for k in made)
        assert all(v["why"] == "measured now" for v in made.values())
        rec = backend.record()
        assert rec["declared"] == "gemm=auto,attention=auto,int8=auto" and rec["decisions"] == made
        from vitkit.bench.machine import machine_line
        assert "backend gemm=auto,attention=auto,int8=auto" in machine_line()
    finally:
        backend.forget()
        backend.set_cache_file(None)


def test_cli_backend_command_and_flag(capsys, monkeypatch):
    monkeypatch.delenv(backend.ENV, raising=False)
    assert main(["backend", "--model", "Ti/16", "--batch", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["declared"] == "gemm=auto,attention=auto,int8=auto"
    assert {r["what"] for r in report["choices"]} >= {"gemm linear float32", "int8 engine",
                                                      "gemm encoder float32 inference Ti/16",
                                                      "gemm encoder float32 training Ti/16"}
    assert main(["--backend", "gemm=aten,attention=explicit", "backend", "--model", "Ti/16", "--measure"]) == 0
    out = capsys.readouterr().out
    assert "declared   gemm=aten,attention=explicit,int8=auto" in out
    assert "gemm linear float32                            aten       declared" in out
    assert "gemm encoder float32 training Ti/16            aten       declared" in out
    monkeypatch.setenv(backend.ENV, "gemm=onednn")
    assert main(["backend", "--model", "Ti/16"]) == 0
    assert "$VITKIT_BACKEND='gemm=onednn' fixes gemm=onednn" in capsys.readouterr().out
    assert main(["backend", "--backend", "gemm=cublas"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gemm='cublas' is not one of auto, aten, onednn" in err[0]


def test_training_records_and_pins_the_backend(tmp_path, monkeypatch):
    """A run's recipe.yaml and results.json say which kernels it ran with; train.deterministic pins them."""
    from _synthetic import write_npz, write_recipe
    from vitkit.train import load_recipe, train

    monkeypatch.delenv(backend.ENV, raising=False)
    data = write_npz(tmp_path / "data.npz")
    recipe = load_recipe(write_recipe(tmp_path, data), {
        "train.deterministic": True, "train.backend": "attention=explicit", "schedule.epochs": 1,
        "train.ema": 0.0})
    res = train(recipe, tmp_path / "run", progress=False)
    saved = load_recipe(tmp_path / "run" / "recipe.yaml")
    assert saved.train.backend == "gemm=aten,attention=explicit,int8=x86"
    assert res["backend"]["declared"] == "gemm=aten,attention=explicit,int8=x86"
    assert json.loads((tmp_path / "run" / "results.json").read_text())["backend"] == res["backend"]
    assert backend.current() == backend.AUTO  # the run's backend ended with the run


def test_a_recipe_that_pins_kernels_wins_over_the_environment_and_the_command_line_wins_over_it(
        tmp_path, monkeypatch, capsys):
    """train.backend in a recipe is what the run computes with, whatever $VITKIT_BACKEND says (with a one-line
    warning naming both); an explicit --backend on the training command replaces the recipe's."""
    from _synthetic import write_npz, write_recipe
    from vitkit.errors import VitkitWarning
    from vitkit.train import load_recipe, train

    data = write_npz(tmp_path / "data.npz")
    path = write_recipe(tmp_path, data)
    recipe = load_recipe(path, {"train.backend": "gemm=aten,attention=explicit", "schedule.epochs": 1,
                                "train.ema": 0.0})
    monkeypatch.setenv(backend.ENV, "gemm=onednn,attention=fused")
    with pytest.warns(VitkitWarning, match=r"pins train.backend=gemm=aten,attention=explicit,int8=auto.*"
                                           r"gemm=onednn,attention=fused,int8=auto, from VITKIT_BACKEND"):
        res = train(recipe, tmp_path / "run", progress=False)
    assert res["backend"]["declared"] == "gemm=aten,attention=explicit,int8=auto"
    monkeypatch.setenv(backend.ENV, "gemm=aten")  # agrees with the pin where it fixes anything: no warning
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        train(recipe, tmp_path / "run2", progress=False)
    assert not [w for w in seen if "pins train.backend" in str(w.message)]
    assert main(["train", "--recipe", str(path), "--set", "train.backend=attention=explicit",
                 "--backend", "gemm=onednn", "--print"]) == 0
    assert "backend: gemm=onednn\n" in capsys.readouterr().out


def test_a_timing_whose_threads_waited_for_the_cpu_is_used_but_not_cached(fresh_cache, monkeypatch):
    """paired_rounds measures how long its threads waited for a CPU (Linux schedstat); remember caches a verdict
    only when that share of the timed thread-time is at most MAX_CPU_WAIT, whatever the load average says."""
    rounds = backend.paired_rounds({"a": lambda: sum(range(2000)), "b": lambda: sum(range(1000))}, 3)
    assert set(rounds) == {"a", "b"} and all(len(v) == 3 for v in rounds.values())
    if backend.run_delay_s() is not None:  # Linux: a share of the timed thread-time, never negative
        assert rounds.cpu_wait is not None and rounds.cpu_wait >= 0
    waits = iter([0.0, 5.0])  # 5 s of waiting during rounds that took milliseconds: other work held the CPU
    monkeypatch.setattr(backend, "run_delay_s", lambda: next(waits))
    assert backend.paired_rounds({"a": lambda: None}, 2).cpu_wait > 1
    monkeypatch.setattr(backend, "run_delay_s", lambda: 1.0)  # no waiting at all
    assert backend.paired_rounds({"a": lambda: None}, 2).cpu_wait == 0
    monkeypatch.setattr(backend, "run_delay_s", lambda: None)  # not Linux: unknown, the load average decides
    assert backend.paired_rounds({"a": lambda: None}, 2).cpu_wait is None
    monkeypatch.setattr(backend, "busy", lambda: False)
    for what, wait, cached in (("x waited", 0.3, False), ("x quiet", 0.01, True), ("x unknown", None, True),
                               ("x at the limit", backend.MAX_CPU_WAIT, True)):
        assert backend.remember(what, {"ratio": 1.5, "cpu_wait": wait}, "onednn") == "onednn"
        assert backend.decisions()[what]["choice"] == "onednn"  # used by this process either way
        written = json.loads(fresh_cache.read_text()) if fresh_cache.exists() else {}
        assert (backend.cache_key(what) in written) is cached
    # a measured kernel choice records its threads' wait and is cached on a quiet machine
    monkeypatch.setattr(kernels, "onednn_ok", lambda dtype: True)
    monkeypatch.setattr(backend, "run_delay_s", lambda: 2.0)
    kernels.calibrate(torch.float32, "linear", rounds=1)
    entry = json.loads(fresh_cache.read_text())[backend.cache_key(kernels.gemm_what(torch.float32, "linear"))]
    assert entry["cpu_wait"] == 0


def test_the_cache_file_comes_from_the_environment_for_started_processes(tmp_path, monkeypatch):
    code = "from vitkit.models import backend; print(backend.cache_path())"
    # the suite's processes measure into the suite's file (conftest sets the variable), not the user's
    seen = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert seen == str(backend.cache_path()) and "kernel-cache" in seen
    mine = tmp_path / "elsewhere" / "k.json"
    env = dict(os.environ, **{backend.CACHE_ENV: str(mine)})
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=env).stdout.strip() == str(mine)
    env.pop(backend.CACHE_ENV)
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=env).stdout.strip() == str(tmp_path / "xdg" / "vitkit" / "kernels.json")
