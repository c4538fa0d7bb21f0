"""The kernel plan (vitkit.models.kernel_plan, planner): the declared backend's parsing, precedence and scoping;
plans resolved once from the backend and the measurement table, bound to the modules and read by forwards that
never time; the one noise rule; graph consumers under every declared backend; every fixed value giving the same
function; bit-identical repeats across processes, with fixed choices and with ``auto``; per-model records."""
import ast
import json
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import vitkit
import vitkit.timing
from _weights import randomize
from vitkit.cli import main
from vitkit.models import kernel_plan, ops, planner
from vitkit.models.cost import cost
from vitkit.models.inference import inference_summary, prepare_inference
from vitkit.models.kernel_plan import Backend, Measurements, resolve, use_backend
from vitkit.timing import MARGIN, Stats, Timed, decide, quiet

FIXED = ["gemm=aten,attention=fused", "gemm=aten,attention=explicit", "gemm=onednn,attention=fused",
         "gemm=onednn,attention=explicit"]


def noisy_model(cfg, std=0.1):
    return randomize(vitkit.VisionTransformer(cfg), std)


def test_parse_spec_and_errors(monkeypatch):
    assert Backend.parse("") == Backend.parse("auto") == Backend() == kernel_plan.AUTO
    b = Backend.parse("gemm=onednn, attention=explicit")
    assert (b.gemm, b.attention, b.int8) == ("onednn", "explicit", "auto") and not b.fixed
    assert Backend.parse(b.spec) == b and b.pinned() == Backend("onednn", "explicit", kernel_plan.PLAIN.int8)
    assert b.pinned().fixed
    with pytest.raises(ValueError, match="gemm='mkl' is not one of auto, aten, onednn"):
        Backend.parse("gemm=mkl")
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        Backend.parse("threads=4")
    monkeypatch.setenv(kernel_plan.ENV, "attention=flash")
    with pytest.raises(ValueError, match="VITKIT_BACKEND='attention=flash'"):
        kernel_plan.current()


def test_precedence_context_over_setting_over_environment(monkeypatch):
    monkeypatch.setenv(kernel_plan.ENV, "gemm=onednn")
    assert kernel_plan.current().gemm == "onednn" and kernel_plan.source() == kernel_plan.ENV
    try:
        kernel_plan.set_backend("gemm=aten")
        assert kernel_plan.current().gemm == "aten" and kernel_plan.source() == "set_backend"
        with use_backend(attention="explicit") as b:  # changes one field, keeps the rest in force
            assert b == kernel_plan.current() == Backend("aten", "explicit")
            with use_backend("gemm=onednn,int8=x86"):
                assert kernel_plan.current() == Backend("onednn", "auto", "x86")
            assert kernel_plan.current() == Backend("aten", "explicit")
        assert kernel_plan.current() == Backend("aten")
    finally:
        kernel_plan.set_backend(None)
    assert kernel_plan.current().gemm == "onednn"
    monkeypatch.delenv(kernel_plan.ENV)
    assert kernel_plan.current() == kernel_plan.AUTO and kernel_plan.source() == "default"



def test_use_backend_is_scoped_to_its_thread():
    seen = {}
    inside, done = threading.Event(), threading.Event()

    def other():
        inside.wait(5)
        seen["other"] = kernel_plan.current().gemm
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with use_backend(gemm="onednn"):
        inside.set()
        done.wait(5)
        seen["mine"] = kernel_plan.current().gemm
    t.join(5)
    assert seen == {"mine": "onednn", "other": kernel_plan.from_environment().gemm}


def _timed(base_times, other_times):
    t = Timed({"a": Stats(list(base_times)), "b": Stats(list(other_times))})
    return t


def test_one_noise_rule_a_margin_on_the_median_paired_round():
    assert decide(_timed([1.0] * 5, [1 / 1.04] * 5), "a") == "a"  # 4% faster: within the noise
    assert decide(_timed([1.0] * 5, [1 / 1.06] * 5), "a") == "b"
    # the median paired round, not the medians: one slow round of b does not decide
    assert decide(_timed([1.0, 1.0, 1.0, 1.0, 1.0], [0.9, 0.9, 5.0, 0.9, 0.9]), "a") == "b"
    assert MARGIN == 1.05 and decide(_timed([1.0], [0.5]), "a", margin=3.0) == "a"
    quiet_t, busy_t = _timed([1.0], [1.0]), _timed([1.0], [1.0])
    quiet_t.cpu_wait, busy_t.cpu_wait = 0.0, vitkit.timing.MAX_CPU_WAIT + 0.01
    assert quiet(quiet_t) or os.getloadavg()[0] > (os.cpu_count() or 1) + 0.5
    assert not quiet(busy_t)
    real = vitkit.timing.alternate({"x": lambda: sum(range(3000)), "y": lambda: None}, repeats=3)
    assert [len(s.times) for s in real.values()] == [3, 3] and real.ratio("x", "y") > 1
    if vitkit.timing.run_delay_s() is not None:  # Linux: a share of the timed thread-time, never negative
        assert real.cpu_wait is not None and real.cpu_wait >= 0


def _table(tiny_cfg, gemm="onednn", attention="explicit", training="onednn/onednn/aten"):
    """A measurement table as a machine that measured those choices for tiny_cfg's shape would hold."""
    tokens = tiny_cfg.num_patches + tiny_cfg.num_prefix_tokens
    images = kernel_plan.chunk_images(16, tokens, kernel_plan.widest_row(tiny_cfg, torch.float32))
    key = lambda kind, n: kernel_plan.encoder_key(tiny_cfg, torch.float32, kind, tokens, n)  # noqa: E731
    return Measurements({key("gemm", images): {"choice": gemm, "summary": "aten/onednn 1.30x"},
                         key("training", 16): {"choice": training},
                         key("attention", images): {"choice": attention},
                         key("attention training", images): {"choice": "fused"}})


def test_resolve_reads_the_declared_backend_and_the_table_and_never_times(tiny_cfg):
    table = _table(tiny_cfg)
    plan = resolve(tiny_cfg, torch.float32, measurements=table, backend="")
    expect_onednn = ops.onednn_ok(torch.float32)
    assert plan.gemm == {"float32": "onednn" if expect_onednn else "aten"}
    assert plan.training == {"float32": "onednn/onednn/aten" if expect_onednn else "aten"}
    assert plan.attention == {"float32 inference": "explicit", "float32 training": "fused"}
    assert plan.why["attention float32 inference"].startswith("measured") and plan.head_tokens == 1
    assert plan.mix_for(torch.float32) == (("onednn", "onednn", "aten") if expect_onednn else None)
    empty = resolve(tiny_cfg, torch.float32, measurements=Measurements(), backend="")
    assert empty.gemm == {"float32": "aten"} and empty.attention_for(torch.float32, True) == "fused"
    assert empty.why["gemm float32"].startswith("static default") or not expect_onednn
    fixed = resolve(tiny_cfg, torch.float32, measurements=table, backend="gemm=aten,attention=fused")
    assert fixed.gemm == {"float32": "aten"} and fixed.why["attention float32 training"] == "declared"
    cuda = resolve(tiny_cfg, torch.float32, "cuda", measurements=table, backend="gemm=onednn")
    assert cuda.gemm == {"float32": "aten"} and cuda.chunk_bytes == 0 and "only ATen" in cuda.why["gemm float32"]
    assert "gemm float32=" in plan.describe() and json.dumps(plan.as_dict())


def test_the_planner_times_only_what_the_table_lacks_and_keeps_it(tiny_cfg, tmp_path):
    calls = []

    def timer(kind, config, dtype, tokens, images):
        calls.append(kind)
        return {"choice": {"gemm": "aten", "training": "aten", "int8": "x86"}.get(kind, "explicit"), "quiet": True}

    path = tmp_path / "k.json"
    plan = resolve(tiny_cfg, torch.float32, measurements=Measurements.load(path), timer=timer, backend="")
    measured = ["attention", "attention training"] + (["gemm", "training"] if ops.onednn_ok(torch.float32) else [])
    assert sorted(calls) == sorted(measured) and plan.attention_for(torch.float32, False) == "explicit"
    calls.clear()
    again = resolve(tiny_cfg, torch.float32, measurements=Measurements.load(path), timer=timer, backend="")
    assert calls == [] and again.attention == plan.attention  # read back from the file: no timing
    resolve(tiny_cfg, torch.float32, measurements=Measurements.load(path), timer=timer, backend="", quantized=True)
    assert calls == ["int8"]  # the int8 engine is timed only for a quantised model
    noisy = Measurements.load(path)
    for entry in noisy.entries.values():
        entry["quiet"] = False  # timed on a busy machine: used, and timed again only when asked
    calls.clear()
    resolve(tiny_cfg, torch.float32, measurements=noisy, timer=timer, backend="")
    assert calls == []
    resolve(tiny_cfg, torch.float32, measurements=noisy, timer=timer, backend="", retime_noisy=True)
    assert "attention" in calls


def test_forwards_never_time_or_consult_the_backend(tiny_cfg, fresh_cache, monkeypatch):
    """A model runs the plan bound to it: no timing in any forward (eager, training, compile), and the backend in
    force when it runs changes nothing (it is read when a plan is resolved)."""
    def no_timing(*a, **k):
        raise AssertionError("a forward timed kernels")

    monkeypatch.setattr(vitkit.timing, "alternate", no_timing)
    monkeypatch.setattr(planner, "alternate", no_timing)
    model = noisy_model(tiny_cfg)
    x = torch.randn(2, 3, 32, 32)
    model(x).sum().backward()
    with torch.inference_mode():
        ref = model.eval()(x)
        with use_backend("gemm=onednn,attention=explicit"):
            assert torch.equal(model(x), ref)
    torch.compile(model, backend="aot_eager", fullgraph=True)(x)
    assert not fresh_cache.exists()
    assert model.kernel_plan.backend == "gemm=auto,attention=auto,int8=auto"
    with use_backend("attention=explicit"):
        assert vitkit.VisionTransformer(tiny_cfg).kernel_plan.attention_for(torch.float32, False) == "explicit"
    explicit = model.set_kernel_plan("attention=explicit")
    assert all(m.plan is explicit is model.kernel_plan for m in model.modules() if "plan" in m.__dict__)


def test_a_model_built_where_measurements_exist_runs_them(tiny_cfg, fresh_cache):
    table = _table(tiny_cfg, attention="explicit")
    fresh_cache.write_text(json.dumps({kernel_plan.machine_key(): table.entries}))
    model = noisy_model(tiny_cfg).eval()
    assert model.kernel_plan.attention_for(torch.float32, False) == "explicit"
    assert model.blocks[0].attn.plan is model.kernel_plan


def test_records_are_per_model_not_per_process(tiny_cfg):
    a = prepare_inference(noisy_model(tiny_cfg), "fp32", measure=False)
    with use_backend("attention=explicit"):
        b = prepare_inference(noisy_model(tiny_cfg), "fp32", measure=False)
    ra, rb = inference_summary(a)["kernel_plan"], inference_summary(b)["kernel_plan"]
    assert ra["attention"]["float32 inference"] == "fused" and rb["attention"]["float32 inference"] == "explicit"
    assert inference_summary(a)["kernel_plan"] == ra  # unchanged by the other model's plan


@pytest.mark.parametrize("gelu", ["none", "tanh"])
def test_the_inference_products_equal_the_reference_on_every_kernel(gelu):
    torch.manual_seed(0)
    x, w, b = torch.randn(40, 24), torch.randn(32, 24) * 0.2, torch.randn(32)
    ref = torch.nn.functional.gelu(x.double() @ w.double().t() + b.double(), approximate=gelu)
    for kernel in ops.KERNELS:
        got = ops.dense_gelu(x.clone(), w, b, gelu, kernel).double()
        assert ((got - ref).abs().max() / ref.abs().max()).item() < 1e-5, kernel
        assert torch.allclose(ops.dense(x, w, b, kernel).double(), x.double() @ w.double().t() + b.double(), atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("training", [False, True])
def test_every_fixed_backend_computes_the_same_function(tiny_cfg, dtype, training):
    """The logits and (in training) every gradient agree across the fixed backends: fp32 to rounding, bf16 to
    bf16 rounding (the explicit path rounds the attention weights to bf16 before AV, the fused kernel does not)."""
    if dtype == torch.bfloat16 and not ops.cpu_has_native_bf16():
        pytest.skip("bf16 runs widened to fp32 here: the fixed paths are covered by the fp32 case")
    base = noisy_model(tiny_cfg.replace(class_token=False, pool="gap")).to(dtype)
    x = torch.randn(4, 3, 32, 32).to(dtype)
    results = {}
    for spec in FIXED:
        if "onednn" in spec and not ops.onednn_ok(dtype):
            continue
        model = base.train() if training else base.eval()
        model.zero_grad()
        model.set_kernel_plan(spec)
        if True:
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


@pytest.mark.parametrize("spec", FIXED)
def test_graph_consumers_get_the_plain_path_whatever_is_declared(tiny_cfg, spec, tmp_path):
    """ONNX export, torch.export, torch.compile (a full graph), TorchScript tracing and the FLOP counter work
    under every declared backend (the oneDNN products are not ops they know: they get ATen's)."""
    from vitkit.export import export_onnx, export_program

    model = noisy_model(tiny_cfg).eval()
    model.set_kernel_plan(spec)
    x = torch.randn(2, 3, 32, 32)
    if True:
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


def _fingerprint(spec: str, dtype: str = "float32", cache: str = "") -> str:
    code = (
        "import hashlib, torch, vitkit\n"
        "from vitkit.models.inference import prepare_inference\n"
        "torch.manual_seed(0)\n"
        "m = vitkit.create_model('Ti/16', img_size=32, patch_size=8, depth=2, num_classes=5)\n"
        "for p in m.parameters():\n"
        "    torch.nn.init.normal_(p, std=0.1)\n"
        f"m.set_kernel_plan({spec!r})\n"
        "x = torch.randn(3, 3, 32, 32)\n"
        "h = hashlib.sha256()\n"
        "out = m(x); out.square().sum().backward()\n"
        "h.update(out.detach().numpy().tobytes())\n"
        "for p in m.parameters(): h.update(p.grad.numpy().tobytes())\n"
        f"p = prepare_inference(m, {dtype!r})\n"  # auto: plans (and times what is not measured yet)
        "h.update(p(x).float().numpy().tobytes())\n"
        "print(h.hexdigest(), p.model.kernel_plan.describe())\n")
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop(kernel_plan.ENV, None)
    if cache:
        env[kernel_plan.CACHE_ENV] = cache
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("spec", ["gemm=aten,attention=fused", "gemm=onednn,attention=explicit"])
def test_results_are_identical_to_the_last_bit_when_the_backend_is_fixed(spec):
    """Two processes on one machine, the same fixed backend: logits, gradients and inference logits hash equal."""
    assert _fingerprint(spec) == _fingerprint(spec)


def test_bf16_logits_are_identical_across_fresh_processes_under_auto(tmp_path):
    """With every field auto, the first process times its choices and keeps them; the second reads them: the
    same plan and bit-identical bf16 logits, whatever the timing noise."""
    cache = str(tmp_path / "kernels.json")
    first = _fingerprint("", "bf16", cache)
    assert Path(cache).exists()
    assert _fingerprint("", "bf16", cache) == first


def test_no_kernel_module_keeps_more_than_two_mutable_holders():
    """The declared backend's ContextVar and set_backend's process default: nothing else at module level that a
    forward or a plan could read as hidden state."""
    root = Path(vitkit.__file__).parent / "models"
    holders = []
    for f in sorted(root.glob("*.py")):
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, (ast.Dict, ast.List, ast.Set,
                                                                                         ast.Call)):
                value = node.value
                name = value.func.attr if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) else \
                    value.func.id if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) else "literal"
                target = getattr(node.targets[0] if isinstance(node, ast.Assign) else node.target, "id", "?")
                constant = (target.isupper() and not target.startswith("_")) or target.startswith("__")
                if name in ("literal", "ContextVar", "dict", "list", "set", "defaultdict") and not constant:
                    holders.append(f"{f.name}:{target}")
    assert holders == ["kernel_plan.py:_SCOPED", "kernel_plan.py:_PROCESS"], holders


def test_cli_backend_command_and_flag(capsys, monkeypatch, fresh_cache):
    assert main(["backend", "--model", "Ti/16", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["declared"] == "gemm=auto,attention=auto,int8=auto" and report["source"] == "default"
    assert report["plan"]["head_tokens"] == 1 and "float32 inference" in report["plan"]["attention"]
    assert not fresh_cache.exists()  # without --measure nothing is timed
    assert main(["--backend", "gemm=aten,attention=explicit", "backend", "--model", "Ti/16", "--measure"]) == 0
    out = capsys.readouterr().out
    assert "declared   gemm=aten,attention=explicit,int8=auto" in out
    assert any(line.startswith("attention float32 inference") and "explicit" in line and "declared" in line
               for line in out.splitlines())
    monkeypatch.setenv(kernel_plan.ENV, "gemm=onednn")
    assert main(["backend", "--model", "Ti/16"]) == 0
    assert "$VITKIT_BACKEND='gemm=onednn'" in capsys.readouterr().out
    assert main(["backend", "--backend", "gemm=cublas"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gemm='cublas' is not one of auto, aten, onednn" in err[0]


def test_training_records_and_pins_the_backend(tmp_path, monkeypatch):
    """A run's recipe.yaml and results.json say which kernels it ran with; train.deterministic pins them."""
    from _synthetic import write_npz, write_recipe
    from vitkit.train import load_recipe, train

    monkeypatch.delenv(kernel_plan.ENV, raising=False)
    data = write_npz(tmp_path / "data.npz")
    recipe = load_recipe(write_recipe(tmp_path, data), {
        "train.deterministic": True, "train.backend": "attention=explicit", "schedule.epochs": 1,
        "train.ema": 0.0})
    res = train(recipe, tmp_path / "run", progress=False)
    saved = load_recipe(tmp_path / "run" / "recipe.yaml")
    assert saved.train.backend == "gemm=aten,attention=explicit,int8=x86"
    assert res["backend"]["declared"] == "gemm=aten,attention=explicit,int8=x86"
    assert json.loads((tmp_path / "run" / "results.json").read_text())["backend"] == res["backend"]
    plan = res["backend"]["kernel_plan"]  # this run's plan, not the process's choices
    assert plan["backend"] == "gemm=aten,attention=explicit,int8=x86"
    assert set(plan["attention"].values()) == {"explicit"} and set(plan["gemm"].values()) == {"aten"}
    assert kernel_plan.current() == kernel_plan.AUTO  # the run's backend ended with the run


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
    monkeypatch.setenv(kernel_plan.ENV, "gemm=onednn,attention=fused")
    with pytest.warns(VitkitWarning, match=r"pins train.backend=gemm=aten,attention=explicit,int8=auto.*"
                                           r"gemm=onednn,attention=fused,int8=auto, from VITKIT_BACKEND"):
        res = train(recipe, tmp_path / "run", progress=False)
    assert res["backend"]["declared"] == "gemm=aten,attention=explicit,int8=auto"
    monkeypatch.setenv(kernel_plan.ENV, "gemm=aten")  # agrees with the pin where it fixes anything: no warning
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        train(recipe, tmp_path / "run2", progress=False)
    assert not [w for w in seen if "pins train.backend" in str(w.message)]
    assert main(["train", "--recipe", str(path), "--set", "train.backend=attention=explicit",
                 "--backend", "gemm=onednn", "--print"]) == 0
    assert "backend: gemm=onednn\n" in capsys.readouterr().out


def test_the_cache_file_comes_from_the_environment_for_started_processes(tmp_path):
    code = "from vitkit.models import kernel_plan; print(kernel_plan.default_cache_path())"
    # the suite's processes measure into the suite's file (conftest sets the variable), not the user's
    seen = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert seen == str(kernel_plan.default_cache_path()) and "kernel-cache" in seen
    mine = tmp_path / "elsewhere" / "k.json"
    env = dict(os.environ, **{kernel_plan.CACHE_ENV: str(mine)})
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=env).stdout.strip() == str(mine)
    env.pop(kernel_plan.CACHE_ENV)
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=env).stdout.strip() == str(tmp_path / "xdg" / "vitkit" / "kernels.json")
