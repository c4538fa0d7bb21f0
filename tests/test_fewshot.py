"""Few-shot linear evaluation: the closed-form solver, the sampling, features and their cache, the CLI."""
import json

import numpy as np
import pytest
import torch

from vitkit import VisionTransformer, ViTConfig
from vitkit.eval import (
    DEFAULT_L2_GRID,
    FeatureCache,
    RidgeSolver,
    cached_features,
    extract_features,
    fewshot_evaluate,
    linear_probe,
    prepare_images,
    sample_shots,
)
from vitkit.eval.fewshot import needed_indices

L2S = [0.0, 2.0 ** -10, 1e-3, 0.1, 1.0, 7.5, 100.0, 2.0 ** 19]


def _problem(n, d, k=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * rng.uniform(0.1, 5.0, size=d) + rng.normal(size=d) * 3  # unscaled features
    y = rng.integers(0, k, n)
    y[:k] = np.arange(k)  # every class present
    return x, y


def _ridge_by_lstsq(design, targets, l2):
    """Ridge as an ordinary least-squares problem: stack sqrt(l2) I under the design matrix."""
    d = design.shape[1]
    a = np.vstack([design, np.sqrt(l2) * np.eye(d)])
    b = np.vstack([targets, np.zeros((d, targets.shape[1]))])
    return np.linalg.lstsq(a, b, rcond=None)[0]


@pytest.mark.parametrize("n,d", [(60, 7), (9, 25)], ids=["more-samples-than-features", "fewer-samples"])
def test_solver_equals_lstsq_for_every_l2(n, d):
    x, y = _problem(n, d)
    solver = RidgeSolver(x, y, 3)
    assert solver.branch == ("gram" if n >= d + 1 else "kernel")
    # the solver's own pre-processing, done by hand: standardise with the shots' statistics, append the bias
    design = np.hstack([(x - x.mean(0)) / (x.std(0) + 1e-5), np.full((n, 1), 100.0)])
    np.testing.assert_allclose(solver.design(x), design, rtol=1e-12, atol=1e-12)
    targets = 2.0 * np.eye(3)[y] - 1.0
    assert set(np.unique(targets)) == {-1.0, 1.0}
    for l2 in L2S:
        expected = _ridge_by_lstsq(design, targets, l2)
        np.testing.assert_allclose(solver.weights(l2), expected, rtol=1e-7, atol=1e-9, err_msg=f"l2={l2}")
        if l2 > 0:  # and the textbook formula
            explicit = np.linalg.solve(design.T @ design + l2 * np.eye(d + 1), design.T @ targets)
            np.testing.assert_allclose(solver.weights(l2), explicit, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("n,d", [(60, 7), (9, 25)])
def test_both_branches_agree(n, d):
    x, y = _problem(n, d, seed=1)
    gram, kernel = RidgeSolver(x, y, 3, branch="gram"), RidgeSolver(x, y, 3, branch="kernel")
    for l2 in L2S:  # l2 = 0 included: both give the minimum-norm least-squares solution
        np.testing.assert_allclose(gram.weights(l2), kernel.weights(l2), rtol=1e-6, atol=1e-8, err_msg=f"l2={l2}")
    xt, yt = _problem(30, d, seed=2)
    np.testing.assert_allclose(gram.scores(xt, L2S), kernel.scores(xt, L2S), rtol=1e-6, atol=1e-7)


def test_interpolates_targets_when_fewer_samples_than_features():
    x, y = _problem(8, 30)
    solver = RidgeSolver(x, y, 3)
    scores = solver.scores(x, [0.0])[0]
    np.testing.assert_allclose(scores, 2.0 * np.eye(3)[y] - 1.0, atol=1e-8)
    assert solver.accuracy(x, y, [0.0])[0] == 1.0


def test_scores_match_weights_and_are_invariant_to_feature_scaling():
    x, y = _problem(40, 6)
    xt, _ = _problem(15, 6, seed=3)
    solver = RidgeSolver(x, y, 3)
    for i, l2 in enumerate(L2S):
        np.testing.assert_allclose(solver.scores(xt, L2S)[i], solver.design(xt) @ solver.weights(l2), atol=1e-9)
    # standardising with the shots' statistics: a per-feature affine change of the features changes nothing
    scale, shift = np.linspace(0.5, 40, 6), np.linspace(-7, 3, 6)
    other = RidgeSolver(x * scale + shift, y, 3)
    np.testing.assert_allclose(other.scores(xt * scale + shift, [1.0]), solver.scores(xt, [1.0]), rtol=1e-4,
                               atol=1e-6)


def test_solver_rejects_bad_input():
    x, y = _problem(10, 3)
    with pytest.raises(ValueError, match="2-D"):
        RidgeSolver(x[:, 0], y)
    with pytest.raises(ValueError, match="labels"):
        RidgeSolver(x, y[:5])
    with pytest.raises(ValueError, match="NaN"):
        RidgeSolver(np.where(x > 1, np.nan, x), y)
    with pytest.raises(ValueError, match="out of range"):
        RidgeSolver(x, y, num_classes=2)
    with pytest.raises(ValueError, match=">= 0"):
        RidgeSolver(x, y).weights(-1.0)


def test_sample_shots_is_per_class_nested_disjoint_and_seeded():
    labels = np.repeat(np.arange(4), 30)
    np.random.default_rng(0).shuffle(labels)
    one, val = sample_shots(labels, 1, seed=3, val_per_class=5)
    five, val5 = sample_shots(labels, 5, seed=3, val_per_class=5)
    assert np.array_equal(val, val5) and len(val) == 20
    assert np.bincount(labels[five], minlength=4).tolist() == [5, 5, 5, 5]
    assert np.bincount(labels[val], minlength=4).tolist() == [5, 5, 5, 5]
    assert set(one) <= set(five) and not set(five) & set(val)
    assert np.array_equal(sample_shots(labels, 5, seed=3, val_per_class=5)[0], five)
    assert not np.array_equal(sample_shots(labels, 5, seed=4, val_per_class=5)[0], five)
    with pytest.raises(ValueError, match="fewer"):
        sample_shots(labels, 26, seed=0, val_per_class=5)
    need = needed_indices(labels, [1, 5], [0, 1], 5)
    for seed in (0, 1):
        for k in (1, 5):
            idx, v = sample_shots(labels, k, seed, val_per_class=5)
            assert set(idx) | set(v) <= set(need)


def _blobs(n_per_class, d=20, k=4, noise_seed=0, spread=0.6):
    """k Gaussian classes with fixed centres; ``noise_seed`` draws another sample of the same classes."""
    centres = np.random.default_rng(1234).normal(size=(k, d)) * 2
    y = np.repeat(np.arange(k), n_per_class)
    return centres[y] + spread * np.random.default_rng(noise_seed).normal(size=(len(y), d)), y


def test_fewshot_evaluate_on_separable_blobs():
    x, y = _blobs(60)
    xt, yt = _blobs(50, noise_seed=1)
    res = fewshot_evaluate(x, y, xt, yt, shots=[1, 5, 10], seeds=[0, 1, 2], val_per_class=10)
    assert [r.shots for r in res] == [1, 5, 10]
    for r in res:
        assert len(r.accuracies) == 3 and r.l2 in DEFAULT_L2_GRID
        assert len(r.per_l2) == len(DEFAULT_L2_GRID)
        assert 0.0 <= r.std and min(r.accuracies) <= r.mean <= max(r.accuracies)
        assert r.to_dict()["mean"] == pytest.approx(np.mean(r.accuracies))
    assert res[-1].mean > 0.97
    # features of only the rows the sweep uses give the same result
    rows = needed_indices(y, [1, 5, 10], [0, 1, 2], 10)
    res2 = fewshot_evaluate(x[rows], y, xt, yt, shots=[1, 5, 10], seeds=[0, 1, 2], val_per_class=10,
                            train_rows=rows)
    assert [r.accuracies for r in res2] == [r.accuracies for r in res]
    with pytest.raises(ValueError, match="cover"):
        fewshot_evaluate(x[rows[:5]], y, xt, yt, shots=[5], seeds=[0], val_per_class=10, train_rows=rows[:5])


def test_fewshot_picks_l2_on_validation_not_test():
    x, y = _blobs(40, d=50, spread=3.0)
    xt, yt = _blobs(40, d=50, spread=3.0, noise_seed=1)
    res = fewshot_evaluate(x, y, xt, yt, shots=[5], seeds=[0, 1], val_per_class=10)[0]
    best_val = max(p["val"] for p in res.per_l2)
    chosen = [p for p in res.per_l2 if p["l2"] == res.l2][0]
    assert chosen["val"] == best_val and res.val_accuracy == best_val
    assert res.mean == pytest.approx(chosen["test"])
    assert len({p["val"] for p in res.per_l2}) > 1 and len({p["test"] for p in res.per_l2}) > 1  # a real choice
    # the test labels scrambled: the validation numbers and the choice stay, only the test numbers move
    scrambled = fewshot_evaluate(x, y, xt, np.random.default_rng(7).permutation(yt), shots=[5], seeds=[0, 1],
                                 val_per_class=10)[0]
    assert [p["val"] for p in scrambled.per_l2] == [p["val"] for p in res.per_l2] and scrambled.l2 == res.l2
    assert [p["test"] for p in scrambled.per_l2] != [p["test"] for p in res.per_l2]
    with pytest.raises(ValueError, match="validation"):
        fewshot_evaluate(x, y, xt, yt, shots=[5], seeds=[0], val_per_class=0)
    single = fewshot_evaluate(x, y, xt, yt, shots=[5], seeds=[0], val_per_class=0, l2_grid=[1.0])[0]
    assert single.l2 == 1.0


def test_linear_probe_on_all_data():
    x, y = _blobs(200, spread=1.5)
    xt, yt = _blobs(100, spread=1.5, noise_seed=1)
    out = linear_probe(x, y, xt, yt)
    assert out["train_size"] == 800 and out["l2"] in DEFAULT_L2_GRID and out["accuracy"] > 0.9
    best = RidgeSolver(x, y, 4).accuracy(xt, yt, [out["l2"]])[0]
    assert out["accuracy"] == pytest.approx(best)
    # the strength is the best on the held-out part of the training set, whatever the test labels say
    # (ties go to the strongest regularisation)
    assert out["val_accuracy"] == max(p["val"] for p in out["per_l2"])
    assert out["l2"] == max(p["l2"] for p in out["per_l2"] if p["val"] == out["val_accuracy"])
    assert len({p["val"] for p in out["per_l2"]}) > 1  # the choice is not trivial on this grid
    scrambled = linear_probe(x, y, xt, np.random.default_rng(5).permutation(yt))
    assert scrambled["per_l2"] == out["per_l2"] and scrambled["l2"] == out["l2"]
    assert scrambled["accuracy"] < 0.5  # the test labels were read, for the score only


# --- features -----------------------------------------------------------------------------
@pytest.fixture
def gray_model():
    cfg = ViTConfig(img_size=16, patch_size=4, in_chans=1, num_classes=5, width=32, depth=2, num_heads=2,
                    mlp_dim=64, representation_size=24)
    model = VisionTransformer(cfg).eval()
    with torch.no_grad():
        model.pos_embed.normal_(std=0.5)
    model.meta.preprocessing = {"mean": [0.25], "std": [0.5]}
    return model


def test_prepare_images():
    imgs = np.arange(2 * 8 * 8, dtype=np.uint8).reshape(2, 8, 8)
    x = prepare_images(imgs, (8, 8), 1, {"mean": [0.5], "std": [0.25]})
    np.testing.assert_allclose(x[:, 0].numpy(), (imgs / 255.0 - 0.5) / 0.25, rtol=1e-5, atol=1e-6)
    rgb = prepare_images(imgs, (16, 12), 3)
    assert rgb.shape == (2, 3, 16, 12) and torch.equal(rgb[:, 0], rgb[:, 2])
    assert -1.0 <= rgb.min() and rgb.max() <= 1.0
    # the resize is bilinear with half-pixel centres: on a horizontal ramp each output column is the ramp
    # at its centre's source position, clamped at the borders (the default 0.5 / 0.5 maps [0, 1] to [-1, 1])
    ramp = np.tile((np.arange(8) * 30).astype(np.uint8), (1, 8, 1))  # [1, 8, 8], 0..210 along the width
    out = prepare_images(ramp, (8, 16), 1)[0, 0]
    src = np.clip((np.arange(16) + 0.5) / 2 - 0.5, 0, 7)
    np.testing.assert_allclose(out.numpy(), np.tile((src * 30 / 255 - 0.5) / 0.5, (8, 1)), rtol=1e-5, atol=1e-5)
    # RGB to a grey model: the mean of the three channels
    colour = np.random.default_rng(0).integers(0, 256, (2, 3, 8, 8), dtype=np.uint8)
    np.testing.assert_allclose(prepare_images(colour, (8, 8), 1)[:, 0].numpy(),
                               (colour.mean(1) / 255.0 - 0.5) / 0.5, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="2-channel"):
        prepare_images(np.zeros((1, 2, 4, 4), np.uint8), (4, 4), 3)


def test_representations(gray_model):
    imgs = np.random.default_rng(0).integers(0, 256, size=(7, 16, 16), dtype=np.uint8)
    x = prepare_images(imgs, (16, 16), 1, gray_model.meta.preprocessing)
    with torch.no_grad():
        tokens = gray_model.forward_features(x)
        want = {"pre_logits": gray_model.forward_head(tokens, pre_logits=True), "token": tokens[:, 0],
                "gap": tokens[:, 1:].mean(1), "pixels": x.flatten(1)}
    for rep, expected in want.items():
        got = extract_features(gray_model, imgs, representation=rep, batch_size=3, progress=False)
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-6, err_msg=rep)
    assert extract_features(gray_model, imgs, progress=False).shape == (7, 24)  # pre-logits width
    pix = extract_features(None, imgs, representation="pixels", progress=False)
    np.testing.assert_allclose(pix, (imgs.reshape(7, -1) / 255.0 - 0.5) / 0.5, atol=1e-6)
    with pytest.raises(ValueError, match="unknown representation"):
        extract_features(gray_model, imgs, representation="logits", progress=False)


def test_feature_cache(gray_model, tmp_path):
    imgs = np.random.default_rng(1).integers(0, 256, size=(6, 16, 16), dtype=np.uint8)
    first = cached_features(gray_model, imgs, cache_dir=tmp_path, data_id="toy", progress=False)
    assert len(list(tmp_path.glob("*.npy"))) == 1 and len(list(tmp_path.glob("*.json"))) == 1

    calls = []
    original = gray_model.forward_features
    gray_model.forward_features = lambda x: calls.append(1) or original(x)
    again = cached_features(gray_model, imgs, cache_dir=tmp_path, data_id="toy", progress=False)
    assert not calls and np.array_equal(first, again)  # read back, the model was not run
    cached_features(gray_model, imgs, cache_dir=tmp_path, data_id="toy", representation="gap", progress=False)
    assert calls and len(list(tmp_path.glob("*.npy"))) == 2  # another representation, another entry
    with torch.no_grad():
        gray_model.head.bias.add_(1.0)  # any weight change makes a new key, even outside the features
    cached_features(gray_model, imgs, cache_dir=tmp_path, data_id="toy", progress=False)
    assert len(list(tmp_path.glob("*.npy"))) == 3
    cached_features(gray_model, imgs[:5], cache_dir=tmp_path, data_id="toy", progress=False)
    assert len(list(tmp_path.glob("*.npy"))) == 4  # other images, another entry

    for f in tmp_path.glob("*.npy"):  # a damaged entry is recomputed, not trusted
        f.write_bytes(b"garbage")
    calls.clear()
    redo = cached_features(gray_model, imgs[:5], cache_dir=tmp_path, data_id="toy", progress=False)
    assert calls and redo.shape == (5, 24)
    key_parts = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert {"model", "images", "representation", "preprocessing"} <= set(key_parts)


def test_feature_cache_roundtrip(tmp_path):
    cache = FeatureCache(tmp_path / "c")
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    key = cache.key({"a": 1})
    assert cache.get(key) is None
    cache.put(key, arr, {"a": 1})
    assert np.array_equal(cache.get(key), arr) and cache.key({"a": 2}) != key


# --- the command -----------------------------------------------------------------------------
@pytest.fixture
def fmnist_available():
    from vitkit.data import find_idx_dataset
    try:
        find_idx_dataset()
    except FileNotFoundError:
        pytest.skip("Fashion-MNIST not installed (make data)")


def test_fewshot_command(tmp_path, capsys, fmnist_available):
    from vitkit.checkpoints import save_model
    from vitkit.cli import main

    cfg = ViTConfig(img_size=28, patch_size=7, in_chans=1, num_classes=10, width=32, depth=1, num_heads=2,
                    mlp_dim=64)
    save_model(VisionTransformer(cfg), tmp_path / "ckpt", preprocessing={"mean": [0.286], "std": [0.353]})
    args = ["fewshot", str(tmp_path / "ckpt"), "--pixels", "--shots", "1", "5", "--seeds", "2", "--train-limit",
            "3000", "--test-limit", "500", "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "o"),
            "--quiet", "--linear-probe"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "1-shot" in out and "5-shot" in out and "pixels" in out and "all data" in out
    report = json.loads((tmp_path / "o" / "fewshot.json").read_text())
    pix = report["results"]["pixels"]
    assert [r["shots"] for r in pix["fewshot"]] == [1, 5] and pix["feature_dim"] == 784
    assert pix["fewshot"][1]["mean"] > 0.45  # raw pixels, 5 shots, 10 classes: far above chance
    assert report["results"][str(tmp_path / "ckpt")]["feature_dim"] == 32
    assert 0.5 < pix["linear_probe"]["accuracy"] < 0.95
    assert (tmp_path / "o" / "fewshot.png").stat().st_size > 1000
    n_cached = len(list((tmp_path / "cache").glob("*.npy")))
    assert n_cached == 4  # (pixels, model) x (train, test)
    assert main(args) == 0  # a second run reads the cache
    assert len(list((tmp_path / "cache").glob("*.npy"))) == n_cached
    assert main(["fewshot", "--shots", "1"]) == 2  # a usage error
    assert "CHECKPOINT" in capsys.readouterr().err


@pytest.mark.slow
def test_trained_features_beat_raw_pixels_at_10_shots(small_trained_vit):
    """A ViT trained briefly on Fashion-MNIST: its frozen features are better few-shot features than pixels."""
    model, (train_x, train_y), (test_x, test_y) = small_trained_vit
    common = dict(shots=[10], seeds=[0, 1, 2, 3, 4], val_per_class=10)
    rows = needed_indices(train_y, [10], common["seeds"], 10)
    vit = fewshot_evaluate(extract_features(model, train_x[rows], progress=False), train_y,
                           extract_features(model, test_x, progress=False), test_y, train_rows=rows, **common)[0]
    pix = fewshot_evaluate(extract_features(None, train_x[rows], representation="pixels", progress=False), train_y,
                           extract_features(None, test_x, representation="pixels", progress=False), test_y,
                           train_rows=rows, **common)[0]
    assert vit.mean > pix.mean + 0.02, (vit.to_dict()["accuracies"], pix.to_dict()["accuracies"])
