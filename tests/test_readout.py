"""The head's contract: the last block computes the tokens the head reads only (``kernel_plan.head_tokens``),
the logits and the gradients those of the whole forward pass, on every path (eager, training, compile,
torch.export, ONNX, FSDP, the served engine); a hook observes without changing what is computed."""
import copy

import pytest
import torch

import vitkit.models.layers as layers_mod
from _weights import randomize
from vitkit import VisionTransformer, ViTConfig
from vitkit.bench.roofline import model_gemms
from vitkit.config import config_from_name
from vitkit.models.cost import cost
from vitkit.models.inference import inference_summary, prepare_inference

BASE = dict(img_size=32, patch_size=8, width=48, depth=3, num_heads=4, mlp_dim=96, num_classes=7)
CASES = {  # name: (config overrides, rows the head reads)
    "class token": ({}, 1),
    "distilled (DeiT)": (dict(distill_token=True, distill_head=True), 2),
    "registers": (dict(reg_tokens=4), 1),
    "layer scale, pre-norm, quick GELU": (dict(layer_scale=0.1, norm_pre=True, gelu="quick"), 1),
    "relative position bias": (dict(posemb="relative"), 1),
    "positions at every layer": (dict(posemb_where="every_layer"), 1),
    "norm after pooling, representation": (dict(final_norm="pooled", representation_size=40), 1),
    "no qkv bias": (dict(qkv_bias=False), 1),
    "GAP": (dict(pool="gap"), None),
    "MAP": (dict(pool="map"), None),
    "axial": (dict(attention="axial", class_token=False, pool="gap"), None),
}


def _model(**kw) -> VisionTransformer:
    torch.manual_seed(0)
    return randomize(VisionTransformer(ViTConfig(**{**BASE, **kw})), 0.2).eval()


def _full(model, x):
    """Logits from every token of the last block: forward_features is public and never prunes."""
    return model.forward_head(model.forward_features(x))


@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_the_whole_forward_pass(case):
    kw, rows = CASES[case]
    model = _model(**kw)
    assert model.kernel_plan.head_tokens == rows == model.config.head_tokens
    x = torch.randn(5, 3, 32, 32)
    with torch.inference_mode():
        fast, full = model(x), _full(model, x)
    scale = full.abs().max().item()
    assert scale > 0.1  # the logits carry information
    # fp32: the same sums per row, perhaps in another order (a GEMM over fewer rows may block differently)
    torch.testing.assert_close(fast, full, rtol=0, atol=2e-6 * scale)


def test_every_token_is_a_key_of_the_last_block():
    """Only the patch tokens change: the class token's logits must change with them (keys and values come from
    every token), and equal the whole pass's."""
    model = _model()
    x = torch.randn(2, 3, 32, 32)
    y = x.clone()
    y[:, :, 24:, 24:] += 1.0  # the last patch only
    with torch.inference_mode():
        a, b = model(x), model(y)
        assert (a - b).abs().max() > 1e-3
        torch.testing.assert_close(b, _full(model, y), rtol=0, atol=1e-5)


def test_bf16_logits_within_rounding_of_the_whole_pass():
    model = _model().to(torch.bfloat16)
    x = torch.randn(4, 3, 32, 32).to(torch.bfloat16)
    with torch.inference_mode():
        fast, full = model(x).float(), _full(model, x).float()
    assert (fast - full).abs().max() <= 0.02 * full.abs().max()


def test_the_last_block_multiplies_only_the_read_rows(monkeypatch):
    model = _model()
    seen = []
    real = layers_mod.dense_gelu

    def spy(x, *a, **k):
        seen.append(x.shape[0])
        return real(x, *a, **k)

    monkeypatch.setattr(layers_mod, "dense_gelu", spy)
    x = torch.randn(3, 3, 32, 32)
    with torch.inference_mode():
        model(x)
        tokens = model.config.num_patches + model.config.num_prefix_tokens
        assert seen == [3 * tokens] * 2 + [3]  # two whole blocks, then the class token's MLP
        seen.clear()
        model.forward_features(x)
        assert seen == [3 * tokens] * 3


def test_hooks_observe_without_changing_what_is_computed():
    model = _model()
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        plain = model(x)
    shapes = []
    handle = model.blocks[-1].mlp.register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape)))
    glob = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
    try:
        with torch.inference_mode():
            hooked = model(x)
    finally:
        handle.remove()
        glob.remove()
    assert shapes == [(2, 1, 48)]  # the last block's hook sees the head's rows, as documented
    assert torch.equal(hooked, plain) and model.kernel_plan.head_tokens == 1
    with torch.inference_mode():  # forward_features and attention maps (rollout) run every token
        assert model.forward_features(x).shape == (2, 17, 48)
        _, maps = model(x, return_attention=True)
    assert maps[-1].shape == (2, 4, 17, 17)


def test_the_opt_out_computes_every_token_and_persists():
    model = _model(head_tokens_only=False)
    assert model.kernel_plan.head_tokens is None and model.config.head_tokens is None
    shapes = []
    model.blocks[-1].mlp.register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape)))
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        out = model(x)
    assert shapes == [(2, 17, 48)]
    torch.testing.assert_close(out, _full(model, x), rtol=0, atol=0)
    again = VisionTransformer.__new__(VisionTransformer)  # the choice travels with the config (saved with weights)
    assert ViTConfig.from_dict(model.config.to_dict()).head_tokens_only is False and again is not None
    assert prepare_inference(model, "fp32", measure=False).model.kernel_plan.head_tokens is None


def _grads(model, logits_of, x, y):
    model.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(logits_of(x), y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("case", ["class token", "distilled (DeiT)", "layer scale, pre-norm, quick GELU"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_training_gradients_equal_the_whole_pass(case, checkpointing):
    """A training step reads the same rows: the rows not computed would get no gradient, so every parameter's
    gradient (the last block's, and through its keys and values every earlier one's) is the whole pass's."""
    model = _model(**CASES[case][0]).train()
    model.grad_checkpointing = checkpointing
    torch.manual_seed(1)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 7, (4,))
    fast = _grads(model, model, x, y)
    full = _grads(model, lambda v: model.forward_head(model.forward_features(v)), x, y)
    assert fast.keys() == full.keys()
    for name in fast:
        scale = full[name].abs().max().item()
        torch.testing.assert_close(fast[name], full[name], rtol=0, atol=1e-5 * max(scale, 1e-3), msg=name)
    assert full["blocks.0.attn.qkv.weight"].abs().max() > 1e-4  # the gradient reaches the first block


def test_training_step_multiplies_only_the_read_rows(monkeypatch):
    model = _model(mlp_dim=80).train()
    seen = []
    real = layers_mod.linear

    def spy(x, w, b=None, mix=None):
        seen.append((tuple(x.shape[:-1]), w.shape[0]))
        return real(x, w, b, mix)

    x = torch.randn(3, 3, 32, 32)
    monkeypatch.setattr(layers_mod, "linear", spy)
    model(x).sum().backward()
    fc1 = [rows for rows, out in seen if out == 80]  # the MLP's first layer of each block
    assert fc1 == [(3, 17), (3, 17), (3, 1)]


def test_int8_models_run_every_row():
    model = _model()
    q = prepare_inference(copy.deepcopy(model), "fp32", quantize="int8", measure=False)
    assert q.model.kernel_plan.head_tokens is None  # activations are quantised per call over all rows
    assert "int8" in q.model.kernel_plan.why["head_tokens"]
    prepared = prepare_inference(copy.deepcopy(model), "fp32", measure=False)
    assert inference_summary(prepared)["kernel_plan"]["head_tokens"] == 1
    assert inference_summary(prepare_inference(_model(pool="gap"), "fp32", measure=False))["kernel_plan"][
        "head_tokens"] is None


def _spy_linear(monkeypatch, seen):
    real = layers_mod.linear
    monkeypatch.setattr(layers_mod, "linear", lambda v, w, b=None, mix=None: seen.append((tuple(v.shape[:-1]),
                                                                                         w.shape[0]))
                        or real(v, w, b, mix))


def test_compile_and_torch_export_keep_the_read_out(monkeypatch):
    model = _model(mlp_dim=80)
    x = torch.randn(3, 3, 32, 32)
    with torch.inference_mode():
        eager = model(x)
    seen = []
    _spy_linear(monkeypatch, seen)
    prepared = prepare_inference(model, "fp32", compile=True, measure=False)
    out = prepared(x)
    torch.testing.assert_close(out, eager, rtol=0, atol=1e-4)
    assert [rows for rows, n in seen if n == 80] == [(3, 17), (3, 17), (3, 1)]  # what the graph traced
    seen.clear()
    with torch.no_grad():
        exported = torch.export.export(model, (x,))
    assert [rows for rows, n in seen if n == 80] == [(3, 17), (3, 17), (3, 1)]
    torch.testing.assert_close(exported.module()(x), eager, rtol=0, atol=1e-5)


def test_onnx_export_and_the_served_engine_run_the_head_contract(tmp_path):
    pytest.importorskip("onnxruntime")
    from vitkit.export import export_onnx
    from vitkit.serve.engines import TorchEngine

    model = _model()
    x = torch.randn(3, 3, 32, 32)
    with torch.inference_mode():
        ref = model.forward_outputs(x)
    report = export_onnx(copy.deepcopy(model), tmp_path / "m.onnx", features=True)
    assert report["max_abs_diff"] < 1e-4 and report["validated"].startswith("onnxruntime")
    shapes = []
    engine = TorchEngine(copy.deepcopy(model), "fp32")
    engine.model.blocks[-1].mlp.register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape)))
    logits, feats = engine.run(x)
    assert shapes == [(3, 1, 48)]  # the served path computes what forward computes
    torch.testing.assert_close(torch.from_numpy(logits), ref.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.from_numpy(feats), ref.features, rtol=0, atol=1e-5)


def test_fsdp_keeps_the_read_out(tmp_path):
    """FSDP's fully_shard registers hooks on every block: the plan, not the hooks, decides what is computed."""
    import torch.distributed as dist
    fully_shard = pytest.importorskip("torch.distributed.fsdp").fully_shard

    model = _model()
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        ref = model(x)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        sharded = copy.deepcopy(model)
        for blk in sharded.blocks:
            fully_shard(blk)
        fully_shard(sharded)
        shapes = []
        sharded.blocks[-1].mlp.register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape)))
        with torch.no_grad():
            out = sharded(x)
    finally:
        dist.destroy_process_group()
    assert shapes == [(2, 1, 48)]
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


def test_roofline_counts_the_products_the_logits_need():
    cfg = config_from_name("B/16")
    full = sum(g.flops for g in model_gemms(cfg, 2))
    assert full == 2 * cost(cfg).flops
    need = sum(g.flops for g in model_gemms(cfg, 2, rows=1))
    d, m, t = cfg.width, cfg.mlp_dim, 197
    # the last block skips, for the 196 patch tokens: q, output projection, MLP, their attention rows
    skipped = 2 * 2 * 196 * (d * d + d * d + 2 * d * m + 2 * t * d)
    assert full - need == skipped
    assert 0.06 < skipped / full < 0.075  # about 7% of ViT-B/16's products
