"""Masked patch prediction (Section 4.6, App. B.1.2): corruption, targets, loss on corrupted patches only."""
import math

import pytest
import torch
import torch.nn.functional as F

import vitkit
from vitkit.models.mpp import (
    KEPT,
    MASKED,
    NONE,
    RANDOM,
    MaskedPatchPrediction,
    class_colors,
    color_classes,
    corrupt,
    mpp_loss,
    mpp_targets,
    quantize,
)


@pytest.fixture
def gray_cfg(tiny_cfg):
    """A Fashion-MNIST-sized ViT: 28 px grey images, 4 px patches (7x7 grid)."""
    return tiny_cfg.replace(img_size=28, in_chans=1)


def test_corruption_proportions_over_many_draws():
    g = torch.Generator().manual_seed(1)
    counts = torch.zeros(4)
    for _ in range(20):
        _, kind = corrupt(torch.randn(100, 64, 8), torch.zeros(8), generator=g)
        assert ((kind != NONE).sum(1) == 32).all()  # exactly half of every image's patches
        counts += torch.bincount(kind.flatten(), minlength=4)
    corrupted = counts[1:].sum()
    assert counts[NONE] == corrupted
    assert abs(counts[MASKED] / corrupted - 0.8) < 0.005
    assert abs(counts[RANDOM] / corrupted - 0.1) < 0.005
    assert abs(counts[KEPT] / corrupted - 0.1) < 0.005
    _, kind = corrupt(torch.randn(10, 49, 8), torch.zeros(8), ratio=0.25, p_mask=1.0, p_random=0.0)
    assert ((kind == MASKED).sum(1) == 12).all() and not (kind == RANDOM).any()


def test_corrupted_embeddings_are_mask_other_patch_or_unchanged():
    tokens = torch.randn(6, 16, 8)  # all distinct
    mask = torch.full((8,), 7.0)
    out, kind, source = corrupt(tokens, mask, generator=torch.Generator().manual_seed(0), return_source=True)
    keep = (kind == NONE) | (kind == KEPT)
    assert torch.equal(out[keep], tokens[keep])
    assert (out[kind == MASKED] == 7.0).all()
    flat = tokens.reshape(-1, 8)
    idx = torch.arange(96).reshape(6, 16)
    assert (kind == RANDOM).any() and (source[kind != RANDOM] == -1).all()
    for b, n in (kind == RANDOM).nonzero().tolist():
        src = (flat == out[b, n]).all(-1).nonzero().flatten().tolist()
        assert src == [int(source[b, n])] and src[0] != idx[b, n]  # an embedding of another patch of the batch


def test_mask_embedding_receives_gradient():
    mask = torch.zeros(8, requires_grad=True)
    out, kind = corrupt(torch.randn(4, 16, 8), mask)
    out.sum().backward()
    assert torch.allclose(mask.grad, torch.full((8,), float((kind == MASKED).sum())))


def test_quantisation_bins():
    v = torch.tensor([0.0, 0.124, 0.125, 0.5, 0.874, 0.875, 0.999, 1.0])
    assert quantize(v).tolist() == [0, 0, 1, 4, 6, 7, 7, 7]
    assert color_classes(torch.tensor([[0.0, 0.5, 0.99], [1.0, 1.0, 1.0], [0.3, 0.0, 0.0]])).tolist() == [
        0 * 64 + 4 * 8 + 7, 511, 2 * 64]
    classes = torch.arange(512)
    assert torch.equal(color_classes(class_colors(classes, 3)), classes)  # bin centres map back


def test_mean_colour_target_on_constructed_patches():
    img = torch.zeros(1, 3, 16, 16)
    img[:, :, :8, :8] = torch.tensor([0.0, 0.5, 0.99]).view(3, 1, 1)  # patch 0: one colour
    img[:, 0, :8, 8:12] = 1.0  # patch 1: red is 1 on half the patch, 0 elsewhere -> mean 0.5
    img[:, :, 8:, :] = 0.3  # patches 2, 3
    t = mpp_targets(img, (8, 8), "mean_color")
    assert t.tolist() == [[0 * 64 + 4 * 8 + 7, 4 * 64, 2 * 64 + 2 * 8 + 2, 2 * 64 + 2 * 8 + 2]]


def test_4x4_target_on_constructed_patches():
    img = torch.zeros(1, 1, 8, 16)  # two 8x8 grey patches; the first has 16 cells of 2x2 with levels 0..7
    levels = torch.arange(16) % 8
    img[0, 0, :, :8] = ((levels.float() + 0.5) / 8).view(4, 4).repeat_interleave(2, 0).repeat_interleave(2, 1)
    img[0, 0, :, 8:] = 1.0
    t = mpp_targets(img, (8, 8), "color4x4")
    assert t.shape == (1, 2, 16)
    assert t[0, 0].tolist() == levels.tolist() and t[0, 1].tolist() == [7] * 16
    rgb = torch.rand(2, 3, 16, 16)
    t = mpp_targets(rgb, (16, 16), "color4x4")
    cell = rgb[0, :, 4:8, 8:12].mean(dim=(1, 2))  # row 1, column 2 -> cell index 6
    assert t.shape == (2, 1, 16) and t.max() < 512 and t[0, 0, 6] == color_classes(cell)


def test_pixel_target_is_the_patch():
    img = torch.rand(2, 3, 8, 12)
    t = mpp_targets(img, (4, 4), "pixels")
    assert t.shape == (2, 6, 48)
    assert torch.equal(t[1, 4], img[1, :, 4:8, 4:8].reshape(-1))  # grid row 1, column 1 -> token 4


def test_loss_only_on_corrupted_patches(gray_cfg):
    mpp = MaskedPatchPrediction(vitkit.VisionTransformer(gray_cfg), "mean_color")
    x = torch.rand(4, 1, 28, 28) * 2 - 1
    out = mpp(x, generator=torch.Generator().manual_seed(0))
    pred, kind = out["prediction"], out["kind"]
    pred.retain_grad()
    out["loss"].backward()
    clean = kind == NONE
    assert (pred.grad[clean] == 0).all() and (pred.grad[~clean].abs().sum(-1) > 0).all()
    manual = F.cross_entropy(pred[~clean], out["target"][~clean])
    assert torch.allclose(out["loss"], manual)
    changed = pred.detach().clone()
    changed[clean] = torch.randn_like(changed[clean]) * 100
    assert torch.allclose(mpp_loss(changed, out["target"], ~clean, "mean_color", 8), manual)
    # the kept 10% count: a patch kept as is still carries loss
    for k in (KEPT, MASKED, RANDOM):
        assert (pred.grad[kind == k] != 0).any() or not (kind == k).any()


@pytest.mark.parametrize("target,outputs", [("mean_color", 512), ("color4x4", 16 * 512), ("pixels", 3 * 64)])
def test_heads_and_targets_fit(tiny_cfg, target, outputs):
    cfg = tiny_cfg.replace(patch_size=8)
    mpp = MaskedPatchPrediction(vitkit.VisionTransformer(cfg), target)
    out = mpp(torch.rand(2, 3, 32, 32) * 2 - 1)
    assert out["prediction"].shape == (2, 16, outputs) and torch.isfinite(out["loss"])
    if target != "pixels":
        assert math.isclose(out["loss"].item(), math.log(512), rel_tol=0.1)  # near chance at init
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    colors = mpp.predict_colors(x)
    assert colors["true"].shape == colors["predicted"].shape == (2, 16, 3)
    assert 0 <= colors["predicted"].min() and colors["predicted"].max() <= 1
    # the true colours: each 8x8 patch's mean of the de-normalised input (x * 0.5 + 0.5), tokens row-major
    true = (x * 0.5 + 0.5).reshape(2, 3, 4, 8, 4, 8).mean(dim=(3, 5)).permute(0, 2, 3, 1).reshape(2, 16, 3)
    torch.testing.assert_close(colors["true"], true)


def test_mpp_on_a_hybrid(tiny_cfg):
    cfg = tiny_cfg.replace(backbone="resnet", backbone_layers=(1,), backbone_width=32, patch_size=1)
    mpp = MaskedPatchPrediction(vitkit.VisionTransformer(cfg), "color4x4")
    assert mpp.patch == (4, 4)  # a token covers the backbone's stride in pixels
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    out = mpp(x)
    assert out["target"].shape == (2, 64, 16) and torch.isfinite(out["loss"])
    # by hand: a 4x4 token has 16 cells of one pixel each; a cell's class is its de-normalised pixel's
    # colour, 3 bits per channel (R * 64 + G * 8 + B); tokens row-major on the 8x8 grid, cells row-major
    bins = ((x * 0.5 + 0.5) * 8).floor().clamp(0, 7).long()
    cls = bins[:, 0] * 64 + bins[:, 1] * 8 + bins[:, 2]  # [2, 32, 32]
    want = cls.reshape(2, 8, 4, 8, 4).permute(0, 1, 3, 2, 4).reshape(2, 64, 16)
    assert torch.equal(out["target"], want)


def test_bad_settings_are_explained(gray_cfg, tiny_cfg):
    vit = vitkit.VisionTransformer(gray_cfg)
    with pytest.raises(ValueError, match="target='colour'"):
        MaskedPatchPrediction(vit, "colour")
    with pytest.raises(ValueError, match="2 values for a 3-channel model"):
        MaskedPatchPrediction(vitkit.VisionTransformer(tiny_cfg), pixel_mean=(0.5, 0.5))
    with pytest.raises(ValueError, match="p_mask \\+ p_random <= 1"):
        corrupt(torch.randn(1, 4, 2), torch.zeros(2), p_mask=0.9, p_random=0.2)
    with pytest.raises(ValueError, match="divisible by 4"):
        mpp_targets(torch.rand(1, 3, 12, 12), (6, 6), "color4x4")


def test_mpp_learns_to_fill_in_masked_patches(gray_cfg):
    """Images of one flat grey level: a masked patch's colour is readable from the visible ones."""
    torch.manual_seed(0)
    vit = vitkit.VisionTransformer(gray_cfg.replace(depth=1, width=32, num_heads=2, mlp_dim=64))
    mpp = MaskedPatchPrediction(vit, "mean_color")
    opt = torch.optim.Adam(mpp.parameters(), lr=5e-3)
    losses = []
    for step in range(40):
        x = (torch.rand(16, 1, 1, 1) * torch.ones(16, 1, 28, 28)) * 2 - 1
        loss = mpp(x)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.75 * math.log(8)  # chance is log(8) for 8 grey levels


# --- vitkit pretrain-mpp on the training engine ----------------------------------------------------------
TINY = {"name": "tiny-mpp", "model": {"img_size": 16, "patch_size": 4, "width": 32, "depth": 2, "num_heads": 2,
                                      "mlp_dim": 64, "pool": "gap", "class_token": False},
        "data.mean": [0.2], "data.std": [0.3], "data.eval_batch_size": 64, "augment.crop": "pad", "augment.pad": 2,
        "augment.flip": False, "augment.label_smoothing": 0.0, "optim.name": "adam", "optim.lr": 3e-3,
        "optim.batch_size": 32, "optim.weight_decay": 0.0, "schedule.epochs": 3, "schedule.warmup_steps": 4,
        "train.ema": 0.9, "train.ckpt_every": 8, "train.log_every": 4, "train.threads": 1,
        "mpp.target": "color4x4", "mpp.eval_images": 64, "mpp.figure_images": 3, "data.val_size": 64}


@pytest.fixture(scope="module")
def quadrants(tmp_path_factory):
    from _synthetic import write_npz

    d = tmp_path_factory.mktemp("mpp")
    return d, write_npz(d / "quadrants.npz")


def _recipe(data, **more):
    from vitkit.train import load_recipe

    return load_recipe("fmnist-mpp", {**TINY, "data.dataset": f"tensors:{data}", **more})


@pytest.fixture(scope="module")
def mpp_run(quadrants):
    from vitkit.train.mpp import pretrain_mpp

    d, data = quadrants
    return d / "run", pretrain_mpp(_recipe(data), d / "run", progress=False)


def test_pretrain_mpp_fills_the_run_folder_and_learns(mpp_run):
    import json

    from vitkit.checkpoints import load_model

    out, res = mpp_run
    for name in ("recipe.yaml", "metrics.jsonl", "checkpoints/last.pt", "model/model.safetensors", "mpp.png",
                 "curves.png", "results.json"):
        assert (out / name).is_file(), name
    assert res["steps"] == 48 and res["objective"] == "mpp" and res["mpp"]["target"] == "color4x4"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    assert train[-1]["loss"] < 0.8 * train[0]["loss"]
    assert res["exported_weights"] == "ema" and res["val_mpp_loss"] < math.log(8)  # held out, 8 grey levels a cell
    evals = [r for r in rows if r["kind"] == "eval"]
    assert len(evals) == 3 and {r["split"] for r in evals} == {"val"}
    assert all("mpp_loss" in r and "mpp_loss_ema" in r for r in evals[:-1])
    assert evals[-1]["final"] and evals[-1]["weights"] == "ema" and evals[-1]["mpp_loss"] == res["val_mpp_loss"]
    vit = load_model(out / "model")  # the bare ViT: no head, no mask embedding
    assert vit.config.num_classes == 0 and not any("mask" in k or "mpp" in k for k in vit.state_dict())
    assert "mpp:" in (out / "recipe.yaml").read_text()


def test_pretrain_mpp_resumes_exactly(quadrants, mpp_run, monkeypatch):
    from safetensors.torch import load_file

    from vitkit.train import Trainer
    from vitkit.train.mpp import MaskedPatchObjective

    d, data = quadrants
    out = d / "resumed"
    assert Trainer(_recipe(data), out, progress=False, stop_after=20,
                   objective=MaskedPatchObjective()).fit() == {"stopped_at": 20}
    # count the training forward passes of the resumed part: a run started over from step 0 would end
    # with the same weights too (same seed), so equal weights alone do not show a resume
    steps = []
    forward = MaskedPatchPrediction.forward
    monkeypatch.setattr(MaskedPatchPrediction, "forward",
                        lambda self, *a, **k: (steps.append(1) if self.training and torch.is_grad_enabled() else None,
                                               forward(self, *a, **k))[1])
    Trainer(_recipe(data), out, progress=False, resume=True, objective=MaskedPatchObjective()).fit()
    assert len(steps) == 48 - 16  # from the last checkpoint (every 8 steps) before the stop at 20
    a, b = load_file(str(mpp_run[0] / "model/model.safetensors")), load_file(str(out / "model/model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_mpp_periodic_evaluations_follow_eval_ema(quadrants):
    """train.eval_ema holds for masked patch prediction too: its periodic evaluation scores the EMA weights
    beside the raw ones, or (false) the raw weights only; the raw scores are the same either way."""
    from vitkit.train import Trainer
    from vitkit.train.mpp import MaskedPatchObjective

    d, data = quadrants
    recs = {}
    for flag in (True, False):
        t = Trainer(_recipe(data, **{"train.eval_ema": flag}), d / f"eval-ema-{flag}", progress=False,
                    objective=MaskedPatchObjective())
        recs[flag] = t.run.objective.validate(t.run, t.state)
    assert "mpp_loss_ema" in recs[True] and not any(k.endswith("_ema") for k in recs[False])
    assert recs[True]["mpp_loss"] == recs[False]["mpp_loss"]


def test_mpp_never_reads_labels(quadrants):
    """The objective ignores labels (shuffled labels, same weights); the labels only choose the validation
    hold-out, which is the same class-stratified split a classifier holds out, so the fine-tunes are chosen
    on images MPP never trained on."""
    from vitkit.data.datasets import tensor_file
    from vitkit.train import Trainer, load_recipe
    from vitkit.train.mpp import MaskedPatchObjective

    d, data = quadrants
    states = []
    for shuffle in (False, True):
        train, test = tensor_file(data, "train"), tensor_file(data, "test")
        if shuffle:
            train.labels = train.labels[torch.randperm(len(train.labels))]
        t = Trainer(_recipe(data, **{"schedule.epochs": 1, "train.ema": 0.0, "data.val_size": None}),
                    d / f"labels{shuffle}", progress=False, data={"train": train, "test": test},
                    objective=MaskedPatchObjective())
        t.fit()
        states.append(t.run.model.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    mpp = Trainer(_recipe(data), d / "split-mpp", progress=False, objective=MaskedPatchObjective())
    clf = Trainer(load_recipe("fmnist-1k", {**{k: v for k, v in TINY.items() if not k.startswith("mpp.")},
                                            "data.dataset": f"tensors:{data}", "data.train_subset": None}),
                  d / "split-clf", progress=False)
    assert torch.equal(mpp.run.data.val.images, clf.run.data.val.images) and len(mpp.run.data.val) == 64


def test_finetune_after_mpp_on_a_stratified_subset(quadrants, mpp_run):
    from vitkit.checkpoints import load_model
    from vitkit.data.datasets import tensor_file
    from vitkit.train import Trainer, load_recipe

    d, data = quadrants
    recipe = load_recipe("fmnist-1k", {**{k: v for k, v in TINY.items() if not k.startswith("mpp.")},
                                       "name": "tiny-ft", "data.dataset": f"tensors:{data}", "data.train_subset": 128,
                                       "optim.name": "adamw", "schedule.epochs": 2,
                                       "init.checkpoint": str(mpp_run[0] / "model")})
    t = Trainer(recipe, d / "ft", progress=False)
    # the 512 training images left after the validation hold-out, of which a class-stratified 128
    per_class = torch.bincount(tensor_file(data, "train").labels) - torch.bincount(t.run.data.val.labels)
    got = torch.bincount(t.run.data.train.labels)
    assert int(per_class.sum()) == 512 and int(got.sum()) == 128
    assert ((got.double() - per_class.double() * 128 / 512).abs() < 1).all()  # each class in proportion
    pre = load_model(mpp_run[0] / "model").state_dict()
    assert torch.equal(t.run.model.state_dict()["blocks.1.mlp.fc1.weight"], pre["blocks.1.mlp.fc1.weight"])
    assert t.run.model.config.num_classes == 4 and (t.run.model.head.weight == 0).all()  # the paper's zero head
    res = t.fit()
    assert res["steps"] == 2 * (len(t.run.data.train) // 32)
    assert (t.run.model.head.weight != 0).any()  # the new head was trained
    # the reported test accuracy is that of the exported model, as `vitkit eval` measures it
    from vitkit.train import evaluate_checkpoint
    again = evaluate_checkpoint(d / "ft" / "model", f"tensors:{data}")
    assert res["test_images"] == again["n"] == 128 and res["test_top1"] == again["top1"]


def test_pretrain_mpp_cli_and_refusals(quadrants, capsys):
    from vitkit.cli import main

    d, data = quadrants
    assert main(["pretrain-mpp", "--print", "--target", "pixels", "--data", f"tensors:{data}"]) == 0
    text = capsys.readouterr().out
    assert "target: pixels" in text and "name: fmnist-mpp" in text and "num_classes" not in text
    assert main(["pretrain-mpp", "--data", f"tensors:{data}", "--set", "augment.mixup=0.8", "--out",
                 str(d / "bad")]) == 1
    assert "Mixup/CutMix blend images" in capsys.readouterr().err
    assert main(["pretrain-mpp", "--set", "mpp.p_mask=0.95", "--out", str(d / "bad2")]) == 1
    assert "p_mask + p_random <= 1" in capsys.readouterr().err
