"""Recipes (print, override, save, reload) and the optimisation pieces (no-decay groups, schedules, EMA)."""
import math
import subprocess
import sys

import pytest
import torch

import vitkit
from vitkit import VisionTransformer, ViTConfig
from vitkit.train import EMA, Schedule, list_recipes, load_recipe, param_groups
from vitkit.train.optim import build_optimizer
from vitkit.train.recipe import Recipe


def test_every_builtin_recipe_loads_and_builds_its_model():
    names = list_recipes()
    for required in ("paper-pretrain", "paper-finetune", "deit", "plain-baseline", "fmnist-demo", "fmnist-fast",
                     "fmnist-long"):
        assert required in names
    for name in names:
        r = load_recipe(name)
        assert r.name == name and r.description
        if not r.init.checkpoint and name != "paper-finetune":
            cfg = r.model_config(num_classes=10, in_chans=3)
            assert cfg.num_classes == 10
    pre = load_recipe("paper-pretrain")
    got = (pre.optim.betas, pre.optim.clip_grad, pre.model_config(10, 3).representation_size)
    assert got == ((0.9, 0.999), 1.0, 768)
    ft = load_recipe("paper-finetune")
    assert (ft.optim.name, ft.optim.momentum, ft.schedule.warmup_steps, ft.init.head) == ("sgd", 0.9, 500, "reset")
    plain = load_recipe("plain-baseline").model_config(1000, 3)
    assert (plain.posemb, plain.pool, plain.class_token) == ("sincos2d", "gap", False)
    deit = load_recipe("deit")
    assert deit.augment.randaugment == (2, 9.0) and deit.augment.repeats == 3 and deit.augment.mixup == 0.8


def test_the_demo_is_a_step_budget():
    """make demo reports the same accuracy on every machine: its length is steps, never a time budget."""
    from vitkit.train.recipe import DEFAULT_RECIPE

    r = load_recipe()
    assert r.name == DEFAULT_RECIPE == "fmnist-demo"
    assert r.schedule.minutes is None and r.schedule.steps == 5584 and r.schedule.warmup_steps == 258


def test_inheritance_and_overrides():
    base = load_recipe("fmnist-fast")
    long = load_recipe("fmnist-long")
    assert long.data.dataset == base.data.dataset and long.model["width"] == 128 != base.model["width"]
    assert "_fmnist" not in list_recipes() and load_recipe("_fmnist").data.std == [0.353]  # a partial, usable as base
    r = load_recipe("fmnist-fast", {"optim.lr": 1e-4, "epochs": 2, "width": 96, "augment.randaugment": [2, 5]})
    assert (r.optim.lr, r.schedule.epochs, r.model["width"], r.augment.randaugment) == (1e-4, 2, 96, (2, 5.0))
    with pytest.raises(ValueError, match="did you mean 'lr'"):
        load_recipe("fmnist-fast", {"optim.lrr": 1})
    with pytest.raises(ValueError, match="several sections"):
        load_recipe("fmnist-fast", {"num_heads": 8})  # model.num_heads or init.num_heads?
    with pytest.raises(ValueError, match="unknown config field"):
        load_recipe("fmnist-fast", {"model.widht": 3})
    with pytest.raises(ValueError, match="unknown recipe 'paper-pretrian'. Did you mean 'paper-pretrain'"):
        load_recipe("paper-pretrian")
    with pytest.raises(ValueError, match="train.precision"):
        load_recipe("fmnist-fast", {"train.precision": "fp8"})


def test_a_folder_named_like_a_recipe_does_not_shadow_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fmnist-long").mkdir()  # e.g. a run folder named after its recipe
    assert load_recipe("fmnist-long").model["width"] == 128
    (tmp_path / "mine").write_text("base: fmnist-fast\noptim: {lr: 0.002}\n")  # a file without a suffix is read
    assert load_recipe("mine").optim.lr == 0.002


def test_save_and_reload_round_trip(tmp_path):
    r = load_recipe("deit", {"optim.lr": 3e-4, "data.dataset": "folder:/x"})
    for suffix in (".yaml", ".json"):
        path = r.save(tmp_path / f"r{suffix}")
        again = load_recipe(path)
        assert again.to_dict() == r.to_dict()
    assert isinstance(Recipe.from_dict(r.to_dict()), Recipe)


def test_cli_prints_lists_and_saves(tmp_path):
    def run(*a):
        return subprocess.run([sys.executable, "-m", "vitkit", *a], capture_output=True, text=True, timeout=120)

    out = run("recipes")
    assert out.returncode == 0 and "paper-finetune" in out.stdout
    out = run("train", "-r", "fmnist-fast", "--set", "optim.lr=0.01", "--epochs", "3", "--print")
    assert out.returncode == 0 and "lr: 0.01" in out.stdout and "epochs: 3" in out.stdout
    out = run("recipes", "paper-pretrain", "--set", "batch_size=512", "--save", str(tmp_path / "p.yaml"))
    assert out.returncode == 0 and load_recipe(tmp_path / "p.yaml").optim.batch_size == 512
    out = run("train", "-r", "paper-pretrain")
    assert out.returncode == 1 and "pass --data" in out.stderr


def test_no_weight_decay_groups_follow_the_model():
    m = VisionTransformer(ViTConfig(img_size=16, patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=64,
                                    num_classes=3))
    groups = param_groups(m, 0.1)
    decay = {id(p) for p in groups[0]["params"]}
    names = {n for n, p in m.named_parameters() if id(p) not in decay}
    assert names == m.no_weight_decay() | {n for n, p in m.named_parameters() if p.ndim <= 1}
    assert {"cls_token", "pos_embed", "blocks.0.norm1.weight", "blocks.0.attn.qkv.bias"} <= names
    assert "blocks.0.attn.qkv.weight" not in names and groups[1]["weight_decay"] == 0.0
    opt = build_optimizer(m, load_recipe("fmnist-fast").optim, torch.device("cpu"))
    assert opt.defaults["betas"] == (0.9, 0.999) and (opt.defaults["fused"] or opt.defaults["foreach"])


def test_layer_wise_lr_decay():
    """optim.layer_decay: block i of L trains at lr * d ** (L - i), the embeddings at lr * d ** (L + 1), the head
    and final norm at lr; weight decay still follows no_weight_decay(); an SGD step moves each weight by exactly
    its group's lr times its gradient."""
    from vitkit.train.optim import set_lr
    m = vitkit.create_model("vit_small_patch14_reg4_dinov2", img_size=28, width=32, depth=3, num_heads=2, mlp_dim=64,
                            num_classes=3)
    groups = param_groups(m, 0.1, 0.5)
    scale = {n: g["lr_scale"] for g in groups for p in g["params"] for n, q in m.named_parameters() if q is p}
    assert scale["patch_embed.proj.weight"] == scale["reg_token"] == scale["cls_token"] == 0.5 ** 4
    assert scale["blocks.0.attn.qkv.weight"] == 0.5 ** 3 and scale["blocks.2.ls2.gamma"] == 0.5
    assert scale["norm.weight"] == scale["head.weight"] == 1.0
    assert all(g["weight_decay"] == (0.1 if g["name"].startswith("decay") else 0.0) for g in groups)
    assert len({id(p) for g in groups for p in g["params"]}) == len(list(m.parameters()))
    opt = torch.optim.SGD(groups, lr=1.0)
    set_lr(opt, 0.2)
    w = m.blocks[0].mlp.fc1.weight
    before, grad = w.detach().clone(), torch.randn_like(w)
    w.grad = grad
    opt.step()
    torch.testing.assert_close(w.detach(), before - 0.2 * 0.5 ** 3 * (grad + 0.1 * before))
    with pytest.raises(vitkit.ConfigError, match="layer_decay"):
        load_recipe("fmnist-fast", overrides={"optim.layer_decay": 1.5})


def test_schedules():
    s = Schedule(1.0, 100, 10, "cosine", min_lr=0.1)
    assert s(0) == pytest.approx(0.1) and s(4) == pytest.approx(0.5) and s(9) == pytest.approx(1.0)  # linear ramp
    assert s(10) == pytest.approx(1.0) and s(55) == pytest.approx(0.1 + 0.9 * 0.5)
    # off the midpoint (where cosine and linear decay agree): a third of the way, cos(pi / 3) = 0.5
    assert s(40) == pytest.approx(0.1 + 0.9 * 0.75) and s(85) == pytest.approx(0.1 + 0.9 * 0.5 * (1 - 3 ** 0.5 / 2))
    assert s(100) == pytest.approx(0.1)
    lin = Schedule(2.0, 20, 0, "linear")
    assert lin(0) == 2.0 and lin(5) == pytest.approx(1.5) and lin(10) == pytest.approx(1.0) and lin(20) == 0.0
    assert Schedule(1.0, 5, 0, "constant")(4) == 1.0
    with pytest.raises(ValueError, match="warm-up"):
        Schedule(1.0, 10, 10)


def test_ema_is_an_exponential_average_and_warms_up():
    lin = torch.nn.Linear(2, 1)
    ema = EMA(lin, 0.9, warmup=False)
    start = lin.weight.detach().clone()
    with torch.no_grad():
        lin.weight.add_(1.0)
    ema.update(lin)
    assert torch.allclose(ema.shadow["weight"], start + 0.1)
    ema2 = EMA(lin, 0.9999, warmup=True)
    assert ema2.rate() == pytest.approx(0.1)  # (1 + 0) / (10 + 0)
    # the warm-up follows the number of updates: (1 + t) / (10 + t) after t updates, each applied at its rate
    shadow = ema2.shadow["weight"].clone()
    for t in range(5):
        assert ema2.rate() == pytest.approx((1 + t) / (10 + t))
        with torch.no_grad():
            lin.weight.mul_(-1.5).add_(0.25)
        d = (1 + t) / (10 + t)
        shadow = d * shadow + (1 - d) * lin.weight.detach()
        ema2.update(lin)
        torch.testing.assert_close(ema2.shadow["weight"], shadow)
    assert EMA(lin, 0.6, warmup=True).rate() == pytest.approx(0.1) and ema2.updates == 5
    ema3 = EMA(lin, 0.6, warmup=True)
    for _ in range(20):
        ema3.update(lin)
    assert ema3.rate() == pytest.approx(0.6)  # (1 + 20) / 30 = 0.7 is capped at the decay
    target = torch.nn.Linear(2, 1)
    ema.copy_to(target)
    assert torch.equal(target.weight, ema.shadow["weight"])
    assert math.isclose(EMA(lin, 0.5, warmup=True).rate(), 0.1)


def _tiny_model():
    torch.manual_seed(0)
    m = VisionTransformer(ViTConfig(img_size=8, patch_size=4, width=16, depth=1, num_heads=2, mlp_dim=32,
                                    num_classes=3, in_chans=1))
    with torch.no_grad():
        m.head.weight.normal_(std=0.1)
    return m


def test_gradient_accumulation_equals_the_full_batch_step():
    from vitkit.train import TrainStep

    # 10 images in 4 micro-batches of 3, 3, 3 and 1: each must count by its size (with equal micro-batches
    # a plain average of the micro-batch losses gives the same step)
    x, y = torch.randn(10, 1, 8, 8), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 2])
    assert [len(c) for c in x.chunk(4)] == [3, 3, 3, 1]
    out = []
    for accum in (1, 4):
        m = _tiny_model()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        stats = TrainStep(m, opt, clip_grad=None, accum_steps=accum)(x, y)
        out.append((m.state_dict(), float(stats["loss"])))
    (a, la), (b, lb) = out
    assert la == pytest.approx(lb, rel=1e-5)
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k


def test_train_step_clips_and_runs_in_bf16():
    from vitkit.train import TrainStep

    torch.manual_seed(0)
    m = _tiny_model()
    with torch.no_grad():  # a non-zero head, so every parameter gets a gradient
        m.head.weight.normal_(0, 0.5)
    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 0])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected_acc = (m.eval()(x).argmax(1) == y).float().mean()
    dtypes = []
    real_forward = m.forward

    def spy(*args, **kwargs):  # the logits' dtype: bf16 when the forward ran under bf16 autocast
        out = real_forward(*args, **kwargs)
        dtypes.append(out.dtype)
        return out

    m.forward = spy
    before = [p.detach().clone() for p in m.parameters()]
    opt = torch.optim.SGD(m.parameters(), lr=1.0)  # plain SGD: the update is minus the clipped gradient
    stats = TrainStep(m, opt, clip_grad=1e-3, precision="bf16")(x, y)
    assert dtypes == [torch.bfloat16]  # the forward ran under bf16 autocast
    assert torch.isfinite(stats["loss"]) and float(stats["grad_norm"]) > 1e-2  # the norm before clipping
    step = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(m.parameters(), before)))
    assert abs(float(step) - 1e-3) < 1e-5  # clipped to the global norm 1e-3
    assert float(stats["acc"]) == float(expected_acc)


def test_user_facing_errors_name_the_key_or_form_that_fixes_them(tmp_path):
    from vitkit.data.datasets import open_dataset
    from vitkit.data.loader import EpochSampler, Loader, usable_cores
    from vitkit.train.optim import Schedule
    from vitkit.train.recipe import ScheduleConfig

    with pytest.raises(ValueError, match=r"schedule.warmup_epochs=0.3 \(30 steps\).*--set schedule.warmup_steps=2"):
        Schedule.from_config(ScheduleConfig(steps=20, warmup_epochs=0.3), 1e-3, 100)
    with pytest.raises(ValueError, match=r"schedule.warmup_steps=40"):
        Schedule.from_config(ScheduleConfig(steps=20, warmup_steps=40), 1e-3, 100)
    with pytest.raises(FileNotFoundError, match=f"vitkit data fetch fashion-mnist --dir {tmp_path}"):  # the fix
        open_dataset(f"fashion-mnist:{tmp_path}", "train")
    assert Loader([], EpochSampler(10, 2), workers=64).workers == usable_cores() <= 64


def test_fp16_is_refused_off_cuda_with_the_fix(tmp_path):
    from _synthetic import write_npz, write_recipe
    from vitkit.train import Trainer
    recipe = load_recipe(write_recipe(tmp_path, write_npz(tmp_path / "q.npz")),
                         {"train.precision": "fp16", "train.device": "cpu"})
    with pytest.raises(vitkit.ConfigError, match=r"fp16 trains with a CUDA gradient scaler.*bf16"):
        Trainer(recipe, tmp_path / "run", progress=False)
    with pytest.raises(vitkit.ConfigError, match="fp32, bf16 or fp16"):
        load_recipe("fmnist-fast", overrides={"train.precision": "fp8"})


def test_demo_recipe_pins_the_kernels():
    """make demo computes the same function on every machine kind: ATen's GEMMs and the fused attention,
    whatever the machine's measurement would pick (the README's accuracy holds everywhere)."""
    from vitkit.models.kernel_plan import PLAIN, Backend

    r = load_recipe("fmnist-demo")
    b = Backend.parse(r.train.backend)
    assert (b.gemm, b.attention) == (PLAIN.gemm, PLAIN.attention)


def test_test_subset_is_fixed_stratified_and_checked(tmp_path):
    """data.test_subset: the same class-stratified test images whatever the training seed; a size beyond the
    split is refused by name."""
    from _synthetic import write_npz
    from vitkit.errors import ConfigError
    from vitkit.train.rundata import open_run_data

    data = write_npz(tmp_path / "d.npz", n_test=200)
    base = {"model": {"img_size": 16, "patch_size": 4, "width": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64},
            "data.dataset": f"tensors:{data}", "data.val_size": 40}
    full = open_run_data(load_recipe("fmnist-demo", base)).test
    runs = [open_run_data(load_recipe("fmnist-demo", {**base, "data.test_subset": 50, "train.seed": s})).test
            for s in (0, 3)]
    assert len(full) == 200 and [len(t) for t in runs] == [50, 50]
    assert torch.equal(runs[0].labels, runs[1].labels)
    (x0, _), (x1, _) = (t.gather(torch.arange(50)) for t in runs)
    assert torch.equal(x0, x1)
    # stratified: each class keeps its share of the split within one image
    share = torch.bincount(full.labels, minlength=4).float() * 50 / 200
    assert (torch.bincount(runs[0].labels, minlength=4).float() - share).abs().max() <= 1.0
    with pytest.raises(ConfigError, match="data.test_subset=500 but the test split has 200"):
        open_run_data(load_recipe("fmnist-demo", {**base, "data.test_subset": 500}))


def test_the_record_recipe_is_a_pure_vit_distilled_from_the_teacher_recipe_on_the_same_split():
    from vitkit.train.distill import Distillation
    from vitkit.train.trainer import objective_for

    student, teacher, long = load_recipe("fmnist-record"), load_recipe("fmnist-teacher"), load_recipe("fmnist-long")
    for r in (student, teacher):  # the same training images, validation hold-out and normalisation
        assert r.data == long.data and r.data.val_size == 5000
    s_cfg, t_cfg = student.model_config(10, 1), teacher.model_config(10, 1)
    # the student: no convolution but the patch projection, DeiT's distillation token, hard distillation from
    # where the teacher recipe's documented command exports its weights
    assert s_cfg.backbone is None and s_cfg.distill_token and s_cfg.class_token and s_cfg.drop_path > 0
    assert (student.distill.teacher, student.distill.kind) == ("runs/fmnist-teacher/model", "hard")
    assert isinstance(objective_for(student), Distillation) and student.train.ema > 0
    a = student.augment
    assert a.randaugment and a.mixup > 0 and a.cutmix > 0 and a.erasing > 0
    # the teacher: ResNet-18's stages (two basic units each) on a 3x3 stride-1 root without max-pool
    assert (t_cfg.depth, t_cfg.backbone_stem, t_cfg.backbone_unit, t_cfg.backbone_layers) == (0, "3x3", "basic",
                                                                                             (2, 2, 2, 2))
    assert teacher.distill.teacher is None and t_cfg.grid_size == (4, 4)
