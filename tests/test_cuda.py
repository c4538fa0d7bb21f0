"""The model's paths on a CUDA device: bf16 inference, a training step, torch.compile. Skipped without CUDA
(no GPU was available where these were written; benchmarks/gpu.sh runs them first on a GPU machine)."""
import copy

import pytest
import torch

from vitkit import VisionTransformer
from vitkit.models import kernels, layers
from vitkit.models.inference import prepare_inference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _model(tiny_cfg, **kw):
    torch.manual_seed(0)
    model = VisionTransformer(tiny_cfg.replace(img_size=48, **kw))  # 145 tokens: the fused kernel runs
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.05)
    return model.eval()


def rel_err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def test_cuda_inference_path_equals_training_path_fp32_and_bf16(tiny_cfg, monkeypatch):
    calls = []
    orig = layers.Block.forward_inference
    monkeypatch.setattr(layers.Block, "forward_inference", lambda self, *a, **k: calls.append(1) or orig(self, *a, **k))
    model = _model(tiny_cfg, posemb="relative").cuda()
    x = torch.randn(5, 3, 48, 48, device="cuda")
    ref = model(x)  # autograd on: training path
    with torch.inference_mode():
        out = model(x)
    assert calls and rel_err(out, ref.detach()) < 1e-5
    assert kernels.gemm_kernel(torch.float32, x.device) == "aten"  # cuBLAS through ATen
    fast = prepare_inference(copy.deepcopy(model), "bf16")
    out16 = fast(x)
    assert out16.dtype == torch.bfloat16 and out16.device.type == "cuda"
    assert rel_err(out16, ref.detach()) < 3e-2


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
