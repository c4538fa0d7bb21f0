"""The model's inference kernels (the same modules as training, layers.fast_inference), prepare_inference, and
the kernel plan's GEMM, training-product and int8 choices: numerics and mechanics, never timings (the choices
are made from injected measurement tables and fake timers). That the inference path equals the training path for
every config field is tests/test_model.py::test_inference_path_equals_training_path."""
import copy
import json

import pytest
import torch

from _weights import randomize
from vitkit import VisionTransformer, create_model
from vitkit.errors import ConfigError
from vitkit.models import kernel_plan, layers, ops, planner
from vitkit.models.inference import Prepared, inference_summary, prepare_inference
from vitkit.models.kernel_plan import (
    CHUNK_BYTES,
    MIXES,
    KernelPlan,
    Measurements,
    chunk_images,
    encoder_key,
    machine_key,
    resolve,
    use_backend,
)
from vitkit.timing import MARGIN, Stats, Timed, decide


def rel_err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def noisy(model, std=0.2):
    return randomize(model, std).eval()


def fake_timer(speedups, calls, quiet=True):
    """A timer for ``resolve``: each contender of a choice runs ``speedups[kind][name]`` times the baseline's
    speed in every round (the baseline: what the planner times against); the choice is made by the planner's
    noise rule (:func:`vitkit.timing.decide`); ``quiet=False``: timed on a busy machine. Records each call in
    ``calls``."""
    def timer(kind, config, dtype, tokens, images):
        calls.append((kind, dtype, tokens, images))
        base = {"gemm": "aten", "training": "aten", "int8": torch.backends.quantized.engine}.get(kind, "fused")
        timed = Timed({base: Stats([1.0] * 3), **{k: Stats([1.0 / v] * 3) for k, v in speedups[kind].items()}})
        return {"choice": decide(timed, base), "summary": f"fake {kind}", "quiet": quiet}
    return timer


def tokens_of(cfg):
    return cfg.num_patches + cfg.num_prefix_tokens


def never(*args):
    raise AssertionError(f"timed {args[0]!r} although the choice was known")


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


@pytest.mark.parametrize("head_tokens_only", [True, False])
def test_hooks_see_the_same_computation_in_inference_and_training(tiny_cfg, head_tokens_only):
    """One block schedule: forward hooks on attn and mlp fire in eval mode and see what training computes; on
    the last block they see the rows the head reads (config.head_tokens), or every token when the config asks
    for all of them (head_tokens_only=False)."""
    model = noisy(VisionTransformer(tiny_cfg.replace(head_tokens_only=head_tokens_only))).double()
    rows = 1 if head_tokens_only else model.config.seq_len
    assert model.kernel_plan.head_tokens == (1 if head_tokens_only else None)
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
        assert v[0].shape == v[1].shape == (3, rows, tiny_cfg.width)
        torch.testing.assert_close(v[1], v[0].detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-12, atol=1e-12)
    full = model.forward_head(model.forward_features(x))  # every token of the last block: the same logits
    torch.testing.assert_close(full, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("per_chunk", [1, 3, 7])
def test_chunks_of_whole_images_change_no_number_and_leave_the_input(tiny_cfg, per_chunk):
    """One image per chunk, a ragged last chunk, one chunk: the same output as the training path."""
    model = noisy(VisionTransformer(tiny_cfg.replace(posemb="relative"))).double()
    x = torch.randn(7, 3, 32, 32, dtype=torch.float64)
    keep = x.clone()
    ref = model(x).detach()
    tokens, row = model.config.seq_len, kernel_plan.widest_row(model.config, torch.float64)
    assert row == max(model.config.mlp_dim, 3 * model.config.width) * 8
    budget = per_chunk * tokens * row
    model.set_kernel_plan(model.kernel_plan.replace(chunk_bytes=budget))
    assert chunk_images(7, tokens, row, budget) <= per_chunk
    with torch.inference_mode():
        out = model(x)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert torch.equal(x, keep)


def test_chunk_size_keeps_the_largest_temporary_within_the_byte_cap_in_even_chunks(tiny_cfg):
    from vitkit.config import config_from_name

    row = 3072 * 4  # ViT-B/16's MLP hidden row in fp32
    b16 = config_from_name("B/16")
    assert kernel_plan.widest_row(b16, torch.float32) == row and kernel_plan.widest_row(b16, torch.bfloat16) == row // 2
    for batch in (1, 7, 16, 64, 1000):
        per = chunk_images(batch, 197, row)
        chunks = -(-batch // per)
        assert per * 197 * row <= CHUNK_BYTES or per == 1
        assert chunks * per - batch < chunks  # no chunk is more than one image short of the others
        assert chunk_images(batch, 197, row) == chunk_images(batch, 197, row, CHUNK_BYTES)
        assert chunk_images(batch, 197, row, 0) == batch  # no cap: the whole batch
    assert chunk_images(64, 197, row) == 13 and chunk_images(64, 197, row // 2) == 22  # 5 and 3 chunks
    assert chunk_images(16, 197, 3072 * 2) == 16  # bf16 batch 16: one chunk
    assert chunk_images(10, 100, row, 250 * row) == 2 and chunk_images(10, 100, row, row) == 1
    assert chunk_images(5, 10, 10 ** 9) == 1  # an image above the cap still runs, one at a time
    # chunks serve a CPU's caches: a plan for any other device runs the whole batch at once
    assert resolve(tiny_cfg, measurements=Measurements()).chunk_bytes == CHUNK_BYTES
    assert resolve(tiny_cfg, device=torch.device("cpu"), measurements=Measurements()).chunk_bytes == CHUNK_BYTES
    assert resolve(tiny_cfg, device="cuda", measurements=Measurements()).chunk_bytes == 0
    assert resolve(tiny_cfg, device="cuda:0", measurements=Measurements()).chunk_bytes == 0
    cpu_plan = resolve(tiny_cfg, measurements=Measurements())
    assert cpu_plan.images_per_chunk(64, 197, row, torch.device("cpu")) == 13
    assert cpu_plan.images_per_chunk(64, 197, row, torch.device("cuda")) == 64  # off the CPU: the whole batch


def test_bf16_inference_is_native_where_the_cpu_has_it_and_widened_elsewhere(tiny_cfg, monkeypatch, fresh_cache):
    model = noisy(VisionTransformer(tiny_cfg))
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
    fast = prepare_inference(copy.deepcopy(model), "bf16")
    out = fast(x)
    assert out.dtype == torch.bfloat16 and fast.model.head.weight.dtype == torch.bfloat16
    summary = inference_summary(fast)
    assert summary["bf16_path"] == ("native" if ops.cpu_has_native_bf16() else "widened to fp32")
    assert summary["kernel_plan"] == fast.model.kernel_plan.as_dict() and summary["backend_source"] == "default"
    assert set(summary["kernel_plan"]["gemm"]) == {"bfloat16"}  # planned for the dtype it runs
    assert rel_err(out, ref) < 3e-2
    # the widened path (CPUs without bf16 hardware): bf16 operands on the fp32 units, same numbers to bf16
    monkeypatch.setattr(ops, "cpu_has_native_bf16", lambda: False)
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
    for engine in ops.int8_candidates():
        q = quantize_int8_(copy.deepcopy(model), engine)
        assert q._int8_engine == engine and torch.backends.quantized.engine == default  # restored
        with torch.inference_mode():
            outs[engine] = q(x)
        assert 0 < rel_err(outs[engine], ref) < 0.1
    for a in outs.values():  # the engines round differently, but far less than int8 vs fp32
        assert rel_err(a, outs[default]) < 0.05
    planned = copy.deepcopy(model)  # no engine given: the plan's
    planned.set_kernel_plan(planned.kernel_plan.replace(int8=ops.int8_candidates()[-1]))
    assert quantize_int8_(planned)._int8_engine == ops.int8_candidates()[-1]


def test_int8_engine_is_chosen_beyond_the_noise_and_kept(tiny_cfg, fresh_cache, monkeypatch):
    """auto: an engine replaces torch's default only when it wins by the noise margin; timed for a quantised
    model only, kept in the measurement file (marked when the machine was busy) and read back by later plans; a
    declared engine needs no measurement; an engine this torch build lacks is refused."""
    monkeypatch.setattr(kernel_plan, "int8_candidates", lambda: ["x86", "onednn"])
    monkeypatch.setattr(torch.backends.quantized, "engine", "x86")
    back, f32, key = "gemm=aten,attention=fused", torch.float32, "int8 engine default=x86"
    calls, speed = [], {"int8": {"onednn": MARGIN - 0.01}}

    def plan(table, quiet=True, quantized=True):
        return resolve(tiny_cfg, f32, backend=back, measurements=table, quantized=quantized,
                       timer=fake_timer(speed, calls, quiet))

    table = Measurements.load(fresh_cache)
    assert plan(table, quantized=False).int8 == "x86" and not calls  # not quantised: no engine is timed
    p = plan(table)
    assert p.int8 == "x86" and calls == [("int8", f32, 0, 0)]  # a win within the noise: torch's default
    assert p.why["int8"].startswith("measured")
    speed["int8"]["onednn"] = 1.8
    assert plan(table).int8 == "x86" and len(calls) == 1  # known: not timed again
    assert json.loads(fresh_cache.read_text())[machine_key()][key]["choice"] == "x86"  # and kept on disk
    assert resolve(tiny_cfg, f32, backend=back, measurements=Measurements.load(fresh_cache), quantized=True,
                   timer=never).int8 == "x86"  # read back by another process
    # timed anew (a table without the entry) while other work loaded the CPU: used, and kept marked as busy
    assert plan(Measurements(path=fresh_cache), quiet=False).int8 == "onednn" and len(calls) == 2
    assert Measurements.load(fresh_cache).entries[key]["quiet"] is False
    assert plan(Measurements(path=fresh_cache)).int8 == "onednn" and len(calls) == 3  # and on a quiet machine
    assert Measurements.load(fresh_cache).entries[key]["choice"] == "onednn"
    assert Measurements.load(fresh_cache).entries[key]["quiet"] is True
    # prepare_inference's plan packs the weights for the kept engine (measure=False: nothing timed)
    q = prepare_inference(noisy(VisionTransformer(tiny_cfg), std=0.1), quantize="int8", measure=False)
    assert q.model.kernel_plan.int8 == "onednn" == q.model._int8_engine
    assert torch.backends.quantized.engine == "x86"
    with use_backend(back, int8="x86"):
        p = resolve(tiny_cfg, f32, measurements=Measurements.load(fresh_cache), quantized=True, timer=never)
        assert p.int8 == "x86" and p.why["int8"] == "declared"  # declared: no measurement decides
    with use_backend(int8="fbgemm"), pytest.raises(ConfigError, match="quantised engines"):
        resolve(tiny_cfg, f32, measurements=Measurements(), quantized=True)


def test_int8_quantisation_and_argument_checks(tiny_cfg):
    model = noisy(VisionTransformer(tiny_cfg), std=0.1)
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
    q = prepare_inference(copy.deepcopy(model), "fp32", quantize="int8")
    assert type(q.model.blocks[0].mlp.fc1) is not torch.nn.Linear  # swapped for the dynamic int8 layer
    assert type(q.model.head) is torch.nn.Linear  # the head stays fp32
    assert q.model.kernel_plan.head_tokens is None  # int8 layers quantise activations over every row
    assert q.model._int8_engine == q.model.kernel_plan.int8 in ops.int8_candidates()
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


# --- the GEMM libraries ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_gemm_kernels_compute_the_same_products(dtype):
    if not ops.onednn_ok(dtype):
        pytest.skip(f"oneDNN's linear does not run {dtype} on this CPU")
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=g).to(dtype) for s in ((50, 24), (40, 24), (40,)))
    out0 = torch.randn(50, 40, generator=g).to(dtype)
    ref = (x.double() @ w.double().t() + b.double())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    with torch.inference_mode():
        for kern in ops.KERNELS:
            assert rel_err(ops._gemm(kern, x, w, b), ref) < tol
            assert rel_err(ops._gemm(kern, x, w, None), ref - b.double()) < tol
            assert rel_err(ops.dense(x, w, b, kern), ref) < tol  # the inference path's call
            assert rel_err(ops._grad_input(kern, out0, w), out0.double() @ w.double()) < tol  # g W
            assert rel_err(ops._grad_weight(kern, out0, x), out0.double().t() @ x.double()) < tol  # g^T x
            for approximate in ("none", "tanh"):  # the MLP's first layer, GELU fused where oneDNN runs it
                gelu = torch.nn.functional.gelu(ref, approximate=approximate)
                assert rel_err(ops.dense_gelu(x, w, b, approximate, kern), gelu) < tol


@pytest.mark.parametrize("chosen", MIXES, ids=lambda m: m.replace("/", "-"))  # every mix auto can choose
@pytest.mark.parametrize("case", ["fp32", "bf16 autocast", "bf16 tensors"])
def test_training_products_on_the_chosen_kernels_equal_f_linear(chosen, case):
    dtype = torch.float32 if case == "fp32" else torch.bfloat16
    if not ops.onednn_ok(dtype) or (dtype == torch.bfloat16 and not ops.cpu_has_native_bf16()):
        pytest.skip(f"oneDNN's linear does not run {dtype} natively on this CPU")
    mix = KernelPlan(training={"float32": chosen, "bfloat16": chosen}).mix_for(dtype)
    assert mix == tuple(chosen.split("/"))
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
        got = step(lambda x, w, b: ops.linear(x, w, b, mix), with_bias)
        ref = step(torch.nn.functional.linear, with_bias)
        assert got[0].dtype == ref[0].dtype and got[0].shape == ref[0].shape == (2, 3, 5, 40)
        assert "ChosenLinear" in type(got[0].grad_fn).__name__
        for a, r in zip(got, ref):
            if r is None:
                assert a is None
            else:
                assert a.dtype == r.dtype and rel_err(a, r) < tol
    # without autograd, and where every product is ATen (mix None), a dense layer is plain F.linear
    with torch.no_grad():
        assert rel_err(ops.linear(*tensors, mix=mix), torch.nn.functional.linear(*tensors)) < 1e-6
    x = tensors[0].clone().requires_grad_()
    assert "Chosen" not in type(ops.linear(x, tensors[1], tensors[2], None).grad_fn).__name__


def test_model_training_step_with_onednn_products_equals_the_aten_step(tiny_cfg):
    if not ops.onednn_ok(torch.float32):
        pytest.skip("no oneDNN linear")
    base = noisy(VisionTransformer(tiny_cfg), std=0.1).train()
    x, y = torch.randn(3, 3, 32, 32), torch.tensor([0, 1, 2])

    def step(plan):
        model = copy.deepcopy(base)
        model.set_kernel_plan(plan)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters()}

    (l1, g1), (l2, g2) = step(base.kernel_plan.replace(training={"float32": MIXES[0]})), step("gemm=aten")
    assert abs(l1.item() - l2.item()) < 1e-5 and g1.keys() == g2.keys()
    assert all(rel_err(g1[n], g2[n]) < 1e-4 for n in g2 if g2[n] is not None and g2[n].abs().max() > 0)


def test_the_gemm_library_is_chosen_beyond_the_noise_once_per_shape_dtype_and_machine(tiny_cfg, fresh_cache,
                                                                                     monkeypatch):
    """resolve never times: with nothing measured, ATen (the static default); given a timer, oneDNN only when
    it wins by the noise margin, kept per machine, shape and dtype and read back; a declared library overrides
    every measurement, both ways; off the CPU, ATen; a timing on a busy machine is used and kept marked as
    such, and timed again when the plan is asked to (``retime_noisy``: ``vitkit backend --measure``)."""
    monkeypatch.setattr(kernel_plan, "onednn_ok", lambda dtype: True)  # oneDNN runs both dtypes here
    f32, bf16 = torch.float32, torch.bfloat16
    back = "attention=fused,int8=x86"  # the GEMM choices only

    def plan(table, dtype=f32, timer=never, **kw):
        return resolve(tiny_cfg, dtype, backend=back, measurements=table, timer=timer, **kw)

    static = resolve(tiny_cfg, f32, backend=back, measurements=Measurements.load(fresh_cache))  # a report never times
    assert static.gemm_for(f32) == "aten" and static.mix_for(f32) is None
    assert static.why["gemm float32"].startswith("static default")
    calls, speed = [], {"gemm": {"onednn": MARGIN - 0.01}, "training": {}}
    timer, table = fake_timer(speed, calls), Measurements.load(fresh_cache)
    p = plan(table, timer=timer)
    assert p.gemm_for(f32) == "aten" and p.mix_for(f32) is None  # a win within the noise: ATen
    tokens = tokens_of(tiny_cfg)
    images = chunk_images(16, tokens, kernel_plan.widest_row(tiny_cfg, f32))  # the chunk the model runs
    assert calls == [("gemm", f32, tokens, images), ("training", f32, tokens, 16)]
    key = encoder_key(tiny_cfg, f32, "gemm", tokens, images)
    saved = json.loads(fresh_cache.read_text())
    assert list(saved) == [machine_key()] and saved[machine_key()][key]["choice"] == "aten"
    assert all(s in machine_key() for s in ("threads", "torch", f"paths {kernel_plan.PATHS_REVISION}"))
    speed["gemm"]["onednn"] = 1.6
    assert plan(table, timer=timer).gemm_for(f32) == "aten" and len(calls) == 2  # known: no new timing
    reread = plan(Measurements.load(fresh_cache))  # read back from the file
    assert reread.gemm_for(f32) == "aten" and reread.why["gemm float32"].startswith("measured")
    assert plan(Measurements(path=fresh_cache), timer=timer).gemm_for(f32) == "onednn"  # timed anew
    assert plan(Measurements.load(fresh_cache)).gemm_for(f32) == "onednn"
    n = len(calls)
    both = plan(Measurements.load(fresh_cache), (f32, bf16), timer=timer)  # another dtype: timed on its own
    assert both.gemm == {"float32": "onednn", "bfloat16": "onednn"}
    assert [c[:2] for c in calls[n:]] == [("gemm", bf16), ("training", bf16)]
    # a verdict measured on an earlier implementation of the paths is not reused
    revision = kernel_plan.PATHS_REVISION
    monkeypatch.setattr(kernel_plan, "PATHS_REVISION", revision + 1)
    assert Measurements.load(fresh_cache).entries == {}
    monkeypatch.setattr(kernel_plan, "PATHS_REVISION", revision)
    assert Measurements.load(fresh_cache).entries[key]["choice"] == "onednn"
    # not a CPU: ATen (cuBLAS on CUDA), nothing timed
    meta = plan(Measurements.load(fresh_cache), device="meta")
    assert meta.gemm_for(f32) == "aten" and meta.mix_for(f32) is None
    # a declared library overrides every measurement, both ways, in the plans resolved inside the block
    with use_backend(back, gemm="aten"):
        p = resolve(tiny_cfg, f32, measurements=Measurements.load(fresh_cache), timer=never)
        assert p.gemm_for(f32) == "aten" and p.mix_for(f32) is None and p.why["gemm float32"] == "declared"
    with use_backend(back, gemm="onednn"):
        p = resolve(tiny_cfg, f32, measurements=Measurements.load(fresh_cache), timer=never)
        assert p.gemm_for(f32) == "onednn" and p.mix_for(f32) == ("onednn",) * 3
        model = VisionTransformer(tiny_cfg)  # a model built inside keeps its plan after the block
    assert model.kernel_plan.gemm_for(f32) == "onednn" and model.blocks[0].mlp.plan is model.kernel_plan
    assert VisionTransformer(tiny_cfg).kernel_plan.gemm_for(f32) == "onednn"  # outside: the measurement
    # timed while other work loaded the CPU: used by this plan and kept, marked as noisy
    speed["gemm"]["onednn"] = 0.5
    busy = plan(Measurements(path=fresh_cache), timer=fake_timer(speed, calls, quiet=False))
    assert busy.gemm_for(f32) == "aten"
    assert Measurements.load(fresh_cache).entries[key]["choice"] == "aten"
    assert Measurements.load(fresh_cache).entries[key]["quiet"] is False
    speed["gemm"]["onednn"] = 1.6
    n = len(calls)
    assert plan(Measurements.load(fresh_cache), timer=timer).gemm_for(f32) == "aten" and len(calls) == n  # read
    retimed = plan(Measurements.load(fresh_cache), timer=timer, retime_noisy=True)  # asked to: timed again
    assert retimed.gemm_for(f32) == "onednn" and [c[:2] for c in calls[n:]] == [("gemm", f32), ("training", f32)]
    assert Measurements.load(fresh_cache).entries[key]["quiet"] is True


def test_the_planner_times_every_contender_of_each_choice(tiny_cfg, fresh_cache):
    """planner.time_choice times every contender on the model's shape and chooses by the noise rule;
    planner.plan times what the table lacks and keeps it, so a second plan from the table times nothing."""
    if not ops.onednn_ok(torch.float32):
        pytest.skip("no oneDNN linear")
    f32, tokens = torch.float32, tokens_of(tiny_cfg)
    for kind, contenders in (("gemm", ops.KERNELS), ("training", ("aten",) + MIXES),
                             ("attention", ops.ATTENTION_PATHS), ("attention training", ops.ATTENTION_PATHS),
                             ("int8", tuple(ops.int8_candidates()))):
        entry = planner.time_choice(kind, tiny_cfg, f32, tokens, 2)
        assert set(entry["median_s"]) == set(contenders) and all(s > 0 for s in entry["median_s"].values())
        assert entry["choice"] in contenders and isinstance(entry["quiet"], bool)
        assert f"needs >= {MARGIN}x" in entry["summary"]
    with pytest.raises(ValueError, match="unknown kernel choice"):
        planner.time_choice("conv", tiny_cfg, f32, tokens, 2)
    table = Measurements()
    timed = planner.plan(tiny_cfg, f32, measurements=table, quantized=True)
    assert len(table.entries) == 5  # gemm, training, attention in inference and training, int8
    assert all(timed.why[w].startswith("measured") for w in ("gemm float32", "training float32", "int8",
                                                              "attention float32 inference",
                                                              "attention float32 training"))
    again = resolve(tiny_cfg, f32, measurements=table, quantized=True, timer=never)
    assert (again.gemm, again.training, again.attention, again.int8) == \
        (timed.gemm, timed.training, timed.attention, timed.int8)


@pytest.mark.parametrize("kern", ops.KERNELS)
def test_model_inference_with_either_kernel_equals_training_path(tiny_cfg, kern):
    if kern == "onednn" and not ops.onednn_ok(torch.float32):
        pytest.skip("no oneDNN linear")
    model = noisy(VisionTransformer(tiny_cfg), std=0.1)
    plan = model.set_kernel_plan(f"gemm={kern}")
    assert plan is model.kernel_plan and plan.gemm_for(torch.float32) == kern and plan.backend.startswith(
        f"gemm={kern},")
    assert all(m.plan is plan for m in model.modules() if "plan" in m.__dict__)
    x = torch.randn(3, 3, 32, 32)
    ref = model(x)
    with torch.inference_mode():
        assert rel_err(model(x), ref.detach()) < 1e-5


def test_an_encoder_in_training_takes_the_mix_its_blocks_ran_fastest_with(tiny_cfg, fresh_cache, monkeypatch):
    """The training products' libraries are chosen by timing encoder blocks of the model's shape, forward +
    backward: the fastest mix when it beats F.linear by the noise margin, else F.linear; kept per shape and
    machine; a declared library overrides it; off the CPU, F.linear; a dtype the plan was not made for, F.linear."""
    monkeypatch.setattr(kernel_plan, "onednn_ok", lambda dtype: True)
    f32, calls = torch.float32, []
    speed = {"gemm": {}, "training": {"onednn/onednn/onednn": 1.01, "onednn/onednn/aten": 1.08,
                                      "onednn/aten/aten": MARGIN}}
    timer, back = fake_timer(speed, calls), "attention=fused,int8=x86"

    def plan(cfg, table, timer=never, **kw):
        return resolve(cfg, f32, backend=back, measurements=table, timer=timer, **kw)

    p = plan(tiny_cfg, Measurements.load(fresh_cache), timer)
    assert p.training == {"float32": "onednn/onednn/aten"} and p.mix_for(f32) == ("onednn", "onednn", "aten")
    assert p.mix_for(torch.bfloat16) is None  # not planned for bf16: F.linear
    assert ("training", f32, tokens_of(tiny_cfg), 16) in calls
    key = encoder_key(tiny_cfg, f32, "training", tokens_of(tiny_cfg), 16)
    assert json.loads(fresh_cache.read_text())[machine_key()][key]["choice"] == "onednn/onednn/aten"
    n = len(calls)
    assert plan(tiny_cfg, Measurements.load(fresh_cache)).mix_for(f32) == ("onednn", "onednn", "aten")
    other = tiny_cfg.replace(width=128, mlp_dim=256)  # another shape: timed on its own
    speed["training"] = {k: MARGIN - 0.03 for k in MIXES}  # no mix beats F.linear beyond the noise
    assert plan(other, Measurements.load(fresh_cache), timer).mix_for(f32) is None
    assert [c[0] for c in calls[n:]] == ["gemm", "training"]
    other_key = encoder_key(other, f32, "training", tokens_of(other), 16)
    assert json.loads(fresh_cache.read_text())[machine_key()][other_key]["choice"] == "aten"
    assert plan(tiny_cfg, Measurements.load(fresh_cache), device="meta").mix_for(f32) is None
    with use_backend(back, gemm="aten"):
        assert resolve(tiny_cfg, f32, measurements=Measurements.load(fresh_cache), timer=never).mix_for(f32) is None
    with use_backend(back, gemm="onednn"):
        assert resolve(other, f32, measurements=Measurements.load(fresh_cache), timer=never).mix_for(f32) == \
            ("onednn",) * 3
    assert len(calls) == n + 2


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_training_model_runs_its_dense_layers_on_the_plans_mix(tiny_cfg, monkeypatch, checkpointing):
    """The model's dense layers run the mix its plan chose (also when gradient checkpointing recomputes the
    blocks in the backward pass); the head runs F.linear; numbers equal F.linear's."""
    if not ops.onednn_ok(torch.float32):
        pytest.skip("no oneDNN linear")
    calls = []
    real = ops.ChosenLinear.apply
    monkeypatch.setattr(ops.ChosenLinear, "apply", lambda *a: calls.append(a[3]) or real(*a))
    base = noisy(VisionTransformer(tiny_cfg), std=0.1).train()
    mixed = base.kernel_plan.replace(training={"float32": "onednn/onednn/aten"})
    x, y = torch.randn(3, 3, 32, 32), torch.tensor([0, 1, 2])

    def step(plan):
        model = copy.deepcopy(base)
        model.set_grad_checkpointing(checkpointing)
        model.set_kernel_plan(plan)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters()}

    (l1, g1) = step(mixed)
    # per block qkv, proj, fc1, fc2, the last block's q and k/v apart (it computes the class token's query only),
    # recomputed in the backward pass under checkpointing; the patch embedding once; the head: F.linear
    blocks = 4 * tiny_cfg.depth + 1
    assert calls == [("onednn", "onednn", "aten")] * (1 + blocks * (2 if checkpointing else 1))
    calls.clear()
    (l2, g2) = step("gemm=aten")
    assert not calls
    assert abs(l1.item() - l2.item()) < 1e-5 and g1.keys() == g2.keys()
    assert all(rel_err(g1[n], g2[n]) < 1e-4 for n in g2 if g2[n] is not None and g2[n].abs().max() > 0)
    base.set_kernel_plan(mixed)
    with torch.no_grad():  # no autograd: no mix
        base(x)
    assert not calls
