"""The model's inference kernels (the same modules as training, layers.fast_inference), prepare_inference, and
the GEMM kernel choice: numerics and mechanics, never timings. That the inference path equals the training path for
every config field is tests/test_model.py::test_inference_path_equals_training_path."""
import copy
import json

import pytest
import torch

from _weights import randomize
from vitkit import VisionTransformer, create_model
from vitkit.models import backend, kernels, layers, precision, tune
from vitkit.models.inference import Prepared, inference_summary, prepare_inference


def rel_err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def noisy(model, std=0.2):
    return randomize(model, std).eval()


def test_inference_kernels_run_only_without_autograd_in_eval_mode(tiny_cfg):
    model = noisy(VisionTransformer(tiny_cfg))
    blk = model.blocks[0]
    assert not layers.fast_inference(blk)  # autograd on
    model.train()
    with torch.no_grad():
        assert not layers.fast_inference(blk)  # training mode: dropout / stochastic depth
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert not layers.fast_inference(blk)  # autocast: its casting rules hold on the training kernels
    with torch.no_grad():
        assert layers.fast_inference(blk)
    with torch.inference_mode():
        assert layers.fast_inference(blk)


def test_hooks_see_the_same_computation_in_inference_and_training(tiny_cfg):
    """One block schedule: forward hooks on attn and mlp fire in eval mode and see what training computes."""
    model = noisy(VisionTransformer(tiny_cfg)).double()
    seen = {"attn": [], "mlp": []}
    for name in seen:
        getattr(model.blocks[1], name).register_forward_hook(
            lambda mod, inp, out, name=name: seen[name].append(out[0] if isinstance(out, tuple) else out))
    x = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    ref = model(x)
    with torch.inference_mode():
        out = model(x)
    assert all(len(v) == 2 for v in seen.values())
    for v in seen.values():
        torch.testing.assert_close(v[1], v[0].detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("per_chunk", [1, 3, 7])
def test_chunks_of_whole_images_change_no_number_and_leave_the_input(tiny_cfg, per_chunk, monkeypatch):
    """One image per chunk, a ragged last chunk, one chunk: the same output as the training path."""
    model = noisy(VisionTransformer(tiny_cfg.replace(posemb="relative"))).double()
    x = torch.randn(7, 3, 32, 32, dtype=torch.float64)
    keep = x.clone()
    ref = model(x).detach()
    tokens, row = model.config.seq_len, max(model.config.mlp_dim, 3 * model.config.width) * 8
    monkeypatch.setattr(layers, "INFERENCE_CHUNK_BYTES", per_chunk * tokens * row)
    assert layers.chunk_images(7, tokens, row) <= per_chunk
    with torch.inference_mode():
        out = model(x)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert torch.equal(x, keep)


def test_chunk_size_keeps_the_largest_temporary_within_the_byte_cap_in_even_chunks():
    from vitkit.models.layers import INFERENCE_CHUNK_BYTES, chunk_images
    row = 3072 * 4  # ViT-B/16's MLP hidden row in fp32
    for batch in (1, 7, 16, 64, 1000):
        per = chunk_images(batch, 197, row)
        chunks = -(-batch // per)
        assert per * 197 * row <= INFERENCE_CHUNK_BYTES or per == 1
        assert chunks * per - batch < chunks  # no chunk is more than one image short of the others
        assert chunk_images(batch, 197, row) == chunk_images(batch, 197, row, None)
    assert chunk_images(64, 197, row) == 13 and chunk_images(64, 197, row // 2) == 22  # 5 and 3 chunks
    assert chunk_images(16, 197, 3072 * 2) == 16  # bf16 batch 16: one chunk
    assert chunk_images(10, 100, row, chunk_tokens=250) == 2 and chunk_images(10, 100, row, chunk_tokens=1) == 1
    assert chunk_images(5, 10, 10 ** 9) == 1  # an image above the cap still runs, one at a time
    assert chunk_images(64, 197, row, device="cpu") == 13 == chunk_images(64, 197, row, device=torch.device("cpu"))
    assert chunk_images(64, 197, row, device="cuda") == 64 and chunk_images(5, 10, 10 ** 9, device="cuda:0") == 5


def test_bf16_inference_is_native_where_the_cpu_has_it_and_widened_elsewhere(tiny_cfg, monkeypatch):
    model = noisy(VisionTransformer(tiny_cfg))
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
    fast = prepare_inference(copy.deepcopy(model), "bf16")
    out = fast(x)
    assert out.dtype == torch.bfloat16 and fast.model.head.weight.dtype == torch.bfloat16
    assert inference_summary(fast)["bf16_path"] == ("native" if precision.cpu_has_native_bf16() else "widened to fp32")
    assert rel_err(out, ref) < 3e-2
    # the widened path (CPUs without bf16 hardware): bf16 operands on the fp32 units, same numbers to bf16
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    widened = fast(x)
    assert rel_err(widened, ref) < 3e-2 and rel_err(widened, out) < 3e-2
    with torch.no_grad():  # and the training path of the same bf16 model, widened the same way
        assert rel_err(widened, fast.model(x.bfloat16())) < 2e-2


def test_int8_weights_packed_for_each_engine_give_the_same_numbers(tiny_cfg):
    from vitkit.models.inference import quantize_int8_
    model = noisy(VisionTransformer(tiny_cfg), std=0.1).eval()
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
    default = torch.backends.quantized.engine
    outs = {}
    for engine in kernels.int8_candidates():
        q = quantize_int8_(copy.deepcopy(model), engine)
        assert q._int8_engine == engine and torch.backends.quantized.engine == default  # restored
        with torch.inference_mode():
            outs[engine] = q(x)
        assert 0 < rel_err(outs[engine], ref) < 0.1
    for a in outs.values():  # the engines round differently, but far less than int8 vs fp32
        assert rel_err(a, outs[default]) < 0.05


def test_int8_engine_is_chosen_beyond_the_noise_and_cached(fresh_cache, monkeypatch):
    monkeypatch.setattr(kernels, "int8_candidates", lambda: ["x86", "onednn"])
    monkeypatch.setattr(torch.backends.quantized, "engine", "x86")
    ratio = {"x86": 1.0, "onednn": 1.05}
    monkeypatch.setattr(kernels, "measure_int8", lambda rounds=7: {"default": "x86", "ratio": dict(ratio)})
    assert kernels.int8_engine() == "x86"  # a 5% win is within the noise
    ratio["onednn"] = 1.8
    assert kernels.int8_engine() == "x86"  # decided for the process
    kernels.forget()
    assert kernels.int8_engine() == "x86"  # and cached on disk
    assert kernels.calibrate_int8() == "onednn" and kernels.int8_engine() == "onednn"
    kernels.forget()
    assert kernels.int8_engine() == "onednn"
    entry = json.loads(fresh_cache.read_text())[backend.cache_key("int8 engine (default x86)")]
    assert entry["choice"] == "onednn" and entry["default"] == "x86"
    with backend.use_backend(int8="x86"):
        assert kernels.int8_engine() == "x86"  # declared: no measurement decides
    with backend.use_backend(int8="fbgemm"), pytest.raises(ValueError, match="quantised engines"):
        kernels.int8_engine()


def test_measure_int8_times_every_engine():
    r = kernels.measure_int8(rounds=1, shape=(16, 32, 24))
    assert set(r["seconds"]) == set(kernels.int8_candidates()) and r["ratio"][r["default"]] == 1.0


def test_int8_quantisation_and_argument_checks(tiny_cfg):
    model = noisy(VisionTransformer(tiny_cfg), std=0.1)
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
    q = prepare_inference(copy.deepcopy(model), "fp32", quantize="int8")
    assert type(q.model.blocks[0].mlp.fc1) is not torch.nn.Linear  # swapped for the dynamic int8 layer
    assert type(q.model.head) is torch.nn.Linear  # the head stays fp32
    assert 0 < rel_err(q(x), ref) < 0.1  # int8 changes the numbers, a little
    with pytest.raises(ValueError, match="fp32"):
        prepare_inference(copy.deepcopy(model), "bf16", quantize="int8")
    with pytest.raises(ValueError, match="quantize"):
        prepare_inference(copy.deepcopy(model), quantize="int4")
    with pytest.raises(ValueError, match="dtype"):
        prepare_inference(model, "fp8")
    with pytest.raises(ValueError, match="VisionTransformer"):
        prepare_inference(torch.nn.Linear(2, 2))
    p = prepare_inference(model)
    assert isinstance(p, Prepared) and p.model is model  # a thin wrapper, not a second model
    with pytest.raises(ValueError, match="not divisible"):
        p(torch.randn(1, 3, 30, 32))


def test_hybrid_model_inference_equals_training_path():
    model = noisy(create_model("R26+S/32", depth=1, img_size=64, num_classes=7), std=0.05)
    x = torch.randn(2, 3, 64, 64)
    ref = model(x)
    with torch.inference_mode():
        assert rel_err(model(x), ref.detach()) < 1e-5


# --- the GEMM kernel choice ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_gemm_kernels_compute_the_same_products(dtype):
    if not kernels.onednn_ok(dtype):
        pytest.skip(f"oneDNN's linear does not run {dtype} on this CPU")
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=g).to(dtype) for s in ((50, 24), (40, 24), (40,)))
    out0 = torch.randn(50, 40, generator=g).to(dtype)
    ref = (x.double() @ w.double().t() + b.double())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    with torch.inference_mode():
        for kern in kernels.KERNELS:
            assert rel_err(kernels._gemm(kern, x, w, b), ref) < tol
            assert rel_err(kernels._gemm(kern, x, w, None), ref - b.double()) < tol
            assert rel_err(kernels._grad_input(kern, out0, w), out0.double() @ w.double()) < tol  # g W
            assert rel_err(kernels._grad_weight(kern, out0, x), out0.double().t() @ x.double()) < tol  # g^T x


CHOICES = list(tune.TRAINING_MIXES)  # every mix auto can choose (gemm=onednn: the first)


@pytest.mark.parametrize("chosen", CHOICES, ids="-".join)
@pytest.mark.parametrize("case", ["fp32", "bf16 autocast", "bf16 tensors"])
def test_training_products_on_the_chosen_kernels_equal_f_linear(chosen, case, monkeypatch):
    dtype = torch.float32 if case == "fp32" else torch.bfloat16
    if not kernels.onednn_ok(dtype) or (dtype == torch.bfloat16 and not precision.cpu_has_native_bf16()):
        pytest.skip(f"oneDNN's linear does not run {dtype} natively on this CPU")
    monkeypatch.setattr(precision, "training_kernels", lambda dt, device: chosen)
    g = torch.Generator().manual_seed(0)
    x0, w0, b0 = (torch.randn(*s, generator=g) for s in ((2, 3, 5, 24), (40, 24), (40,)))
    up = torch.randn(2, 3, 5, 40, generator=g)  # the gradient arriving from above
    tensors = (x0, w0, b0) if case != "bf16 tensors" else (x0.bfloat16(), w0.bfloat16(), b0.bfloat16())

    def step(fn, with_bias=True):
        x, w, b = (t.clone().requires_grad_() for t in tensors)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case == "bf16 autocast"):
            y = fn(x, w, b if with_bias else None)
        (y.float() * up).sum().backward()
        return y, x.grad, w.grad, b.grad

    tol = 1e-5 if case == "fp32" else 2e-2
    for with_bias in (True, False):
        got, ref = step(precision.linear, with_bias), step(torch.nn.functional.linear, with_bias)
        assert got[0].dtype == ref[0].dtype and got[0].shape == ref[0].shape == (2, 3, 5, 40)
        assert "ChosenLinear" in type(got[0].grad_fn).__name__
        for a, r in zip(got, ref):
            if r is None:
                assert a is None
            else:
                assert a.dtype == r.dtype and rel_err(a, r) < tol
    # without autograd, and where every product is ATen, a dense layer is plain F.linear
    with torch.no_grad():
        assert rel_err(precision.linear(*tensors), torch.nn.functional.linear(*tensors)) < 1e-6
    monkeypatch.setattr(precision, "training_kernels", lambda dt, device: None)
    x = tensors[0].clone().requires_grad_()
    assert "Chosen" not in type(precision.linear(x, tensors[1], tensors[2]).grad_fn).__name__


def test_model_training_step_with_onednn_products_equals_the_aten_step(tiny_cfg, monkeypatch):
    if not kernels.onednn_ok(torch.float32):
        pytest.skip("no oneDNN linear")
    base = noisy(VisionTransformer(tiny_cfg), std=0.1).train()
    x, y = torch.randn(3, 3, 32, 32), torch.tensor([0, 1, 2])

    def step(chosen):
        monkeypatch.setattr(precision, "training_kernels", lambda dt, device: chosen)
        model = copy.deepcopy(base)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters()}

    (l1, g1), (l2, g2) = step(("onednn",) * 3), step(None)
    assert abs(l1.item() - l2.item()) < 1e-5 and g1.keys() == g2.keys()
    assert all(rel_err(g1[n], g2[n]) < 1e-4 for n in g2 if g2[n] is not None and g2[n].abs().max() > 0)


def test_calibration_chooses_onednn_only_beyond_the_noise_and_caches_per_machine(fresh_cache, monkeypatch):
    monkeypatch.setattr(kernels, "onednn_ok", lambda dtype: True)
    ratio = {"linear": 1.05}
    monkeypatch.setattr(kernels, "measure", lambda dtype, op, rounds=7: {"aten_s": ratio[op], "onednn_s": 1.0,
                                                                         "ratio": ratio[op]})
    cpu, f32 = torch.device("cpu"), torch.float32
    assert kernels.summary(f32)["linear"]["why"] == "not measured yet"  # a report never measures
    assert kernels.gemm_kernel(f32, cpu, "linear") == "aten"  # a 5% win is within the noise
    assert kernels.training_kernels(f32, cpu) is None  # a training layer outside an encoder: F.linear
    key = backend.cache_key("gemm linear float32")
    entry = json.loads(fresh_cache.read_text())[key]
    assert entry["choice"] == "aten" and entry["min_gain"] == kernels.MIN_GAIN
    ratio["linear"] = 1.6
    assert kernels.gemm_kernel(f32, cpu, "linear") == "aten"  # decided: no new measurement
    kernels.forget()
    assert kernels.gemm_kernel(f32, cpu, "linear") == "aten"  # read back from the file
    assert backend.decisions()["gemm linear float32"] == {"choice": "aten", "why": "cached measurement"}
    assert kernels.calibrate(f32, "linear") == "onednn"  # re-measured on demand
    assert kernels.gemm_kernel(f32, cpu, "linear") == "onednn"
    assert kernels.gemm_kernel(torch.bfloat16, cpu, "linear") == "onednn"  # another dtype: measured again
    assert kernels.gemm_kernel(f32, torch.device("meta")) == "aten"  # not a CPU: aten (cuBLAS on CUDA)
    assert "threads" in key and "torch" in key and f"paths {backend.PATHS_REVISION}" in key
    # a verdict measured on an earlier implementation of the paths is not reused: measured again
    revision = backend.PATHS_REVISION
    try:
        backend.PATHS_REVISION = revision + 1
        assert backend.cached_choice("gemm linear float32", kernels.KERNELS) is None
    finally:
        backend.PATHS_REVISION = revision
    assert backend.cached_choice("gemm linear float32", kernels.KERNELS) == "onednn"
    assert kernels.summary(f32)["linear"]["kernel"] == "onednn"
    assert set(kernels.summary(f32)) == set(kernels.OPS)
    assert kernels.training_kernels(f32, cpu) is None and kernels.training_kernels(f32, torch.device("meta")) is None
    # a declared library overrides every measurement, both ways
    with backend.use_backend(gemm="aten"):
        assert kernels.gemm_kernel(f32, cpu, "linear") == "aten" and kernels.training_kernels(f32, cpu) is None
        assert kernels.summary(f32)["linear"] == {"kernel": "aten", "why": "declared"}
    with backend.use_backend(gemm="onednn"):
        assert kernels.gemm_kernel(f32, cpu, "linear") == "onednn"
        assert kernels.training_kernels(f32, cpu) == ("onednn",) * 3
    # measured while other work loaded the CPU: used by this process, never cached for the next ones
    monkeypatch.setattr(backend, "busy", lambda: True)
    ratio["linear"] = 0.5
    assert kernels.calibrate(f32, "linear") == "aten" and kernels.gemm_kernel(f32, cpu, "linear") == "aten"
    assert json.loads(fresh_cache.read_text())[key]["choice"] == "onednn"


def test_measure_times_both_kernels():
    if not kernels.onednn_ok(torch.float32):
        pytest.skip("no oneDNN linear")
    for op in kernels.OPS:
        r = kernels.measure(torch.float32, op, rounds=1, shape=(32, 16, 24))
        assert r["aten_s"] > 0 and r["onednn_s"] > 0 and r["ratio"] > 0
    for bad in ("conv", "grad_weight", "training onednn/aten/onednn"):
        with pytest.raises(ValueError, match="operation"):
            kernels.measure(torch.float32, bad)


@pytest.mark.parametrize("kern", kernels.KERNELS)
def test_model_inference_with_either_kernel_equals_training_path(tiny_cfg, kern):
    if kern == "onednn" and not kernels.onednn_ok(torch.float32):
        pytest.skip("no oneDNN linear")
    model = noisy(VisionTransformer(tiny_cfg), std=0.1)
    x = torch.randn(3, 3, 32, 32)
    with backend.use_backend(gemm=kern):
        ref = model(x)
        with torch.inference_mode():
            assert rel_err(model(x), ref.detach()) < 1e-5


def test_an_encoder_in_training_takes_the_mix_its_blocks_ran_fastest_with(fresh_cache, monkeypatch):
    """The training products' libraries are chosen by timing encoder blocks of the model's shape, forward +
    backward: the fastest mix when it beats F.linear by tune.MIN_GAIN, else F.linear; cached per shape and
    machine; a declared library overrides it; off the CPU and under a graph consumer, F.linear."""
    monkeypatch.setattr(kernels, "onednn_ok", lambda dtype: True)
    ratios = {"onednn/onednn/onednn": 1.01, "onednn/onednn/aten": 1.08, "onednn/aten/aten": 1.05}
    asked = []

    def measure(dtype, *shape):
        asked.append(shape)
        mixes = {k: {"s": 1.0 / v, "ratio": v} for k, v in ratios.items()}
        best = max(mixes, key=lambda k: mixes[k]["ratio"])
        return {"aten_s": 1.0, "mixes": mixes, "best": best, "ratio": mixes[best]["ratio"]}
    monkeypatch.setattr(tune, "measure_training_blocks", measure)
    cpu, f32 = torch.device("cpu"), torch.float32
    shape = (384, 6, 1536, 197, tune.TRAINING_IMAGES, "exact")
    assert tune.encoder_training_gemms(f32, cpu, *shape) == ("onednn", "onednn", "aten")
    what = tune.training_what(f32, *shape)
    entry = json.loads(fresh_cache.read_text())[backend.cache_key(what)]
    assert entry["choice"] == "onednn/onednn/aten" and entry["min_gain"] == tune.MIN_GAIN
    assert backend.decisions()[what]["choice"] == "onednn/onednn/aten"
    tune.forget()
    assert tune.encoder_training_gemms(f32, cpu, *shape) == ("onednn", "onednn", "aten") and len(asked) == 1
    other = (768, 12, 3072, 197, tune.TRAINING_IMAGES, "exact")  # another shape: timed on its own
    ratios.update({k: 1.02 for k in ratios})  # no mix beats F.linear beyond the noise
    assert tune.encoder_training_gemms(f32, cpu, *other) is None and len(asked) == 2
    assert json.loads(fresh_cache.read_text())[backend.cache_key(tune.training_what(f32, *other))]["choice"] == "aten"
    assert tune.encoder_training_gemms(f32, torch.device("meta"), *shape) is None
    with backend.use_backend(gemm="aten"):
        assert tune.encoder_training_gemms(f32, cpu, *shape) is None
    with backend.use_backend(gemm="onednn"):
        assert tune.encoder_training_gemms(f32, cpu, *other) == ("onednn",) * 3
    assert len(asked) == 2
    # inside the encoder's context the layers take the mix; outside, F.linear; another dtype is not covered
    with kernels.training_gemms(f32, ("onednn", "aten", "aten")):
        assert kernels.training_kernels(f32, cpu) == ("onednn", "aten", "aten")
        assert kernels.training_kernels(torch.bfloat16, cpu) is None
        with kernels.training_gemms(f32, None):
            assert kernels.training_kernels(f32, cpu) is None
    assert kernels.training_kernels(f32, cpu) is None
    with pytest.raises(ValueError, match="mix"):
        with kernels.training_gemms(f32, ("onednn", "mkl", "aten")):
            pass


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_training_model_runs_its_blocks_products_on_the_encoders_mix(tiny_cfg, monkeypatch, checkpointing):
    """The blocks' dense layers run the mix chosen for the model's shape (also when gradient checkpointing
    recomputes them in the backward pass); the head outside the encoder runs F.linear; numbers equal F.linear's."""
    if not kernels.onednn_ok(torch.float32):
        pytest.skip("no oneDNN linear")
    seen = []
    monkeypatch.setattr(tune, "encoder_training_gemms", lambda dtype, device, *shape: seen.append(shape) or
                        ("onednn", "onednn", "aten"))
    calls = []
    real = kernels.ChosenLinear.apply
    monkeypatch.setattr(kernels.ChosenLinear, "apply", lambda *a: calls.append(a[3]) or real(*a))
    base = noisy(VisionTransformer(tiny_cfg), std=0.1).train()
    x, y = torch.randn(3, 3, 32, 32), torch.tensor([0, 1, 2])

    def step(declared):
        model = copy.deepcopy(base)
        model.set_grad_checkpointing(checkpointing)
        with backend.use_backend(gemm=declared):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters()}

    (l1, g1) = step("auto")
    assert seen and seen[0] == tune.training_shape(tiny_cfg)
    # qkv, proj, fc1, fc2 per block, the last block's q and k/v apart (it computes the class token's query only);
    # patch embedding and head: F.linear
    per_forward = 4 * tiny_cfg.depth + 1
    assert calls == [("onednn", "onednn", "aten")] * per_forward * (2 if checkpointing else 1)
    (l2, g2) = step("aten")
    assert abs(l1.item() - l2.item()) < 1e-5 and g1.keys() == g2.keys()
    assert all(rel_err(g1[n], g2[n]) < 1e-4 for n in g2 if g2[n] is not None and g2[n].abs().max() > 0)
    calls.clear()
    with torch.no_grad():
        base(x)
    assert not calls


def test_training_block_timing_times_every_mix():
    if not kernels.onednn_ok(torch.float32):
        pytest.skip("no oneDNN linear")
    r = tune.measure_training_blocks(torch.float32, 32, 2, 64, 17, 2, rounds=1)
    assert set(r["mixes"]) == {kernels.mix_name(m) for m in tune.TRAINING_MIXES}
    assert r["aten_s"] > 0 and all(v["s"] > 0 and v["ratio"] > 0 for v in r["mixes"].values())
    assert r["best"] in r["mixes"] and r["ratio"] == r["mixes"][r["best"]]["ratio"]
    assert kernels.parse_mix(kernels.mix_name(("onednn", "aten", "aten"))) == ("onednn", "aten", "aten")
    assert kernels.parse_mix("aten") is None and kernels.mix_name(None) == "aten"
