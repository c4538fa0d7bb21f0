"""The model's paths on a CUDA device: bf16 inference, a training step, torch.compile. Skipped without CUDA
(no GPU was available where these were written; benchmarks/gpu.sh runs them first on a GPU machine)."""
import copy

import pytest
import torch

from _weights import perturb
from vitkit import VisionTransformer
from vitkit.models import layers
from vitkit.models.inference import prepare_inference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _model(tiny_cfg, **kw):
    torch.manual_seed(0)
    model = VisionTransformer(tiny_cfg.replace(img_size=48, **kw))  # 145 tokens: the fused kernel runs
    return perturb(model, 0.05).eval()


def rel_err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def test_cuda_inference_kernels_equal_the_training_path_fp32_and_bf16(tiny_cfg, monkeypatch):
    """model.eval() under inference_mode runs the dense layers through the inference kernels (cuBLAS via ATen
    on CUDA, the fused attention kernel) and gives the training path's logits; bf16 within bf16 rounding."""
    calls = []
    orig = layers.dense
    monkeypatch.setattr(layers, "dense", lambda *a, **k: calls.append(1) or orig(*a, **k))
    model = _model(tiny_cfg, posemb="relative").cuda()
    x = torch.randn(5, 3, 48, 48, device="cuda")
    ref = model(x)  # autograd on: training path
    assert not calls
    with torch.inference_mode():
        out = model(x)
    assert calls and rel_err(out, ref.detach()) < 1e-5
    fast = prepare_inference(copy.deepcopy(model), "bf16")
    plan = fast.model.kernel_plan  # planned for the GPU: cuBLAS through ATen, the fused attention, whole batches
    assert plan.device == "cuda" and set(plan.gemm.values()) == {"aten"} and plan.chunk_bytes == 0
    assert set(plan.attention.values()) == {"fused"}
    out16 = fast(x)
    assert out16.dtype == torch.bfloat16 and out16.device.type == "cuda"
    assert rel_err(out16, ref.detach()) < 3e-2


def test_cuda_logits_equal_timms(tmp_path):
    """A timm ViT-B/16 state dict (random weights, 2 blocks) loaded by vitkit gives timm's logits on CUDA in
    fp32 (TF32 off on both) to 1e-5, and in bf16 inference within bf16 rounding."""
    timm = pytest.importorskip("timm")
    import vitkit
    torch.manual_seed(0)
    ref = perturb(timm.create_model("vit_base_patch16_224", pretrained=False, depth=2, num_classes=100).eval(), 0.02)
    torch.save(ref.state_dict(), tmp_path / "ref.pth")
    ours = vitkit.create_model("vit_base_patch16_224", weights=tmp_path / "ref.pth").cuda().eval()
    ref = ref.cuda()
    x = torch.randn(8, 3, 224, 224, device="cuda")
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.inference_mode():
            want, got = ref(x), ours(x)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    assert got.shape == (8, 100) and rel_err(got, want) < 1e-5
    fast = prepare_inference(ours, "bf16")
    assert rel_err(fast(x), want) < 3e-2


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_training_step_lowers_the_loss(tiny_cfg, precision):
    from vitkit.train import TrainStep, build_optimizer
    from vitkit.train.recipe import OptimConfig

    model = _model(tiny_cfg).cuda().train()
    opt = build_optimizer(model, OptimConfig(name="adamw", lr=1e-3, weight_decay=0.0), torch.device("cuda"))
    step = TrainStep(model, opt, precision=precision, clip_grad=1.0)
    x, y = torch.randn(16, 3, 48, 48, device="cuda"), torch.randint(0, 10, (16,), device="cuda")
    losses = [float(step(x, y)["loss"]) for _ in range(8)]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


def test_cuda_compiled_inference_equals_eager(tiny_cfg):
    model = _model(tiny_cfg).cuda()
    x = torch.randn(4, 3, 48, 48, device="cuda")
    with torch.inference_mode():
        ref = model(x)
    compiled = prepare_inference(copy.deepcopy(model), "fp32", compile=True)
    assert rel_err(compiled(x), ref) < 1e-4


def test_fp16_training_with_a_gradient_scaler(tmp_path):
    """train.precision=fp16 on CUDA: autocast in fp16, the loss scaled and unscaled before clipping, the
    scale saved in the checkpoint; a stop and --resume continues with the same losses."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from _synthetic import write_npz, write_recipe
    from vitkit.train import Trainer, load_recipe
    from vitkit.train.runlog import read_metrics
    recipe = load_recipe(write_recipe(tmp_path, write_npz(tmp_path / "q.npz")),
                         {"train.precision": "fp16", "train.device": "cuda", "schedule.epochs": 1,
                          "train.ckpt_every": 8, "train.log_every": 2, "train.predictions": 0})
    full = Trainer(recipe, tmp_path / "full", progress=False)
    full.fit()
    state = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=False)
    assert state["grad_scaler"]["scale"] > 0
    Trainer(recipe, tmp_path / "part", progress=False, stop_after=10).fit()
    Trainer(recipe, tmp_path / "part", resume=True, progress=False).fit()
    losses = [[r["loss"] for r in read_metrics(tmp_path / run) if r["kind"] == "train"] for run in ("full", "part")]
    assert all(torch.isfinite(torch.tensor(x)).all() for x in losses)
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)


def test_serve_on_cuda_answers_as_the_cpu_model(tmp_path):
    """vitkit serve --device cuda: the torch engine on the GPU classifies, embeds and explains over HTTP, with the
    probabilities and embedding of the same checkpoint run on the CPU."""
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    import vitkit
    from _serve import image_bytes, serving, tiny_checkpoint
    from vitkit import load_weights
    from vitkit.serve.app import create_app
    ckpt = tiny_checkpoint(tmp_path / "tiny")
    (tmp_path / "a.png").write_bytes(image_bytes("PNG", seed=1))
    want = vitkit.classify(load_weights(ckpt), [tmp_path / "a.png"], topk=3, progress=False)[0]
    data = (tmp_path / "a.png").read_bytes()
    with serving(create_app(str(ckpt), engine="torch", device="cuda", engine_budget_s=0, max_wait_ms=5)) as srv:
        got = httpx.post(srv.url + "/v1/classify?topk=3", content=data, headers={"Content-Type": "image/png"})
        assert got.status_code == 200, got.text
        row = got.json()["results"][0]
        assert [t["label"] for t in row["top"]] == [t["label"] for t in want.top]
        assert max(abs(a["prob"] - b["prob"]) for a, b in zip(row["top"], want.top)) < 1e-4
        emb = httpx.post(srv.url + "/v1/embed", content=data, headers={"Content-Type": "image/png"})
        exp = httpx.post(srv.url + "/v1/explain?topk=2", content=data, headers={"Content-Type": "image/png"})
        assert emb.status_code == 200 and exp.status_code == 200, (emb.text, exp.text)
        assert len(emb.json()["results"][0]["embedding"]) == 64 and exp.json()["results"][0]["overlay_png"]
        info = httpx.get(srv.url + "/v1/model").json()
        assert info["engine"]["name"] == "torch" and info["options"]["device"] == "cuda"
