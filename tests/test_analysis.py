"""The paper's analysis instruments on constructed cases with exact answers, and on a small trained ViT."""
import json
import math

import numpy as np
import pytest
import torch

from vitkit import VisionTransformer, ViTConfig
from vitkit.analysis import (
    analyze,
    attention_distance,
    attention_rollout,
    cosine_similarity_grid,
    embedding_filters,
    fuse_heads,
    mean_attention_distance,
    near_far_similarity,
    patch_distances,
    posemb_similarity,
    readout_of,
    rollout_maps,
    rollout_to_grid,
    similarity_by_distance,
)
from vitkit.models.posemb import resize_pos_embed, sincos_2d


# --- constructed models ------------------------------------------------------------------------
def _identity_attention_model(depth=3, heads=2, class_token=True, pool=None):
    """Every token attends only to itself in every layer and head.

    Tokens are one-hot per head (token t has a 1 at dimension t of every head's slice), q = k = 10 x the
    LayerNormed token, so the logits favour the diagonal by ~300 and softmax gives exactly the identity;
    the blocks' outputs are zeroed so the tokens stay as they are from layer to layer.
    """
    hd = 8
    cfg = ViTConfig(img_size=8, patch_size=4, in_chans=1, num_classes=3, width=heads * hd, depth=depth,
                    num_heads=heads, mlp_dim=16, class_token=class_token,
                    pool=pool or ("token" if class_token else "gap"))
    model = VisionTransformer(cfg).eval()
    d, t = cfg.width, cfg.seq_len
    with torch.no_grad():
        model.patch_embed.proj.weight.zero_()
        model.patch_embed.proj.bias.zero_()
        if model.cls_token is not None:
            model.cls_token.zero_()
        table = torch.zeros(t, d)
        for tok in range(t):
            for h in range(heads):
                table[tok, h * hd + tok] = 1.0
        model.pos_embed.copy_(table[None])
        for blk in model.blocks:
            blk.attn.qkv.weight.zero_()
            blk.attn.qkv.bias.zero_()
            blk.attn.qkv.weight[:d] = 10 * torch.eye(d)
            blk.attn.qkv.weight[d:2 * d] = 10 * torch.eye(d)
            blk.attn.proj.weight.zero_()
            blk.attn.proj.bias.zero_()
            blk.mlp.fc2.weight.zero_()
            blk.mlp.fc2.bias.zero_()
    return model


def _uniform_attention_model(cfg):
    """q = k = 0: every attention logit is 0, so every token attends uniformly to all tokens."""
    model = VisionTransformer(cfg).eval()
    d = cfg.width
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.qkv.weight[:2 * d] = 0
            blk.attn.qkv.bias[:2 * d] = 0
    return model


# --- attention rollout ----------------------------------------------------------------------------
def test_rollout_of_identity_attention_is_one_hot_on_the_class_token():
    model = _identity_attention_model(depth=3)
    x = torch.randn(2, 1, 8, 8)
    out = model.forward_intermediates(x, output_fmt="dict", return_attention=True)
    eye = torch.eye(5).expand(2, 2, 5, 5)
    for a in out["attention"]:
        assert torch.equal(a, eye)  # exactly the identity
    roll = attention_rollout(out["attention"])
    assert torch.equal(roll, torch.eye(5).expand(2, 5, 5))
    maps = rollout_maps(model, x, upsample=False)
    assert maps.shape == (2, 2, 2) and torch.equal(maps, torch.zeros(2, 2, 2))  # no patch reaches the class token
    # without a class token the read-out is the patch mean: each patch contributes exactly 1/4, a uniform map
    gap = _identity_attention_model(depth=2, class_token=False)
    for a in gap.forward_intermediates(x, output_fmt="dict", return_attention=True)["attention"]:
        assert torch.equal(a, torch.eye(4).expand(2, 2, 4, 4))
    assert torch.equal(rollout_maps(gap, x, upsample=False), torch.full((2, 2, 2), 0.25))


def test_rollout_reads_out_what_the_head_reads():
    # constructed rollout, 1 class token + 2x2 patches: the class token gathers patch 0 only, every patch
    # token only itself
    roll = torch.eye(5)[None].clone()
    roll[0, 0] = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0])
    assert rollout_to_grid(roll, (2, 2), 1, "token").flatten().tolist() == [1.0, 0.0, 0.0, 0.0]
    assert rollout_to_grid(roll, (2, 2), 1, "gap").flatten().tolist() == [0.25] * 4  # patch rows, not the class row
    # DeiT: class token -> patch 0, distillation token -> patch 3; the head reads their mean
    roll = torch.eye(6)[None].clone()
    roll[0, 0], roll[0, 1] = torch.eye(6)[2], torch.eye(6)[5]
    assert rollout_to_grid(roll, (2, 2), 2, "distilled").flatten().tolist() == [0.5, 0.0, 0.0, 0.5]
    assert rollout_to_grid(roll, (2, 2), 2, "token").flatten().tolist() == [1.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="needs 2 prefix"):
        rollout_to_grid(torch.eye(5)[None], (2, 2), 1, "distilled")
    # a model with a class token but GAP: identity attention, so each patch contributes 1/4 (the class
    # token's row, which the head never reads, would give an all-zero map)
    gap_cls = _identity_attention_model(depth=2, class_token=True, pool="gap")
    assert readout_of(gap_cls.config) == "gap"
    maps = rollout_maps(gap_cls, torch.randn(2, 1, 8, 8), upsample=False)
    assert torch.equal(maps, torch.full((2, 2, 2), 0.25))
    deit = ViTConfig(img_size=8, patch_size=4, width=16, depth=1, num_heads=2, mlp_dim=16, distill_token=True)
    assert readout_of(deit) == "distilled" and readout_of(deit.replace(distill_head=False)) == "token"


@pytest.mark.parametrize("class_token", [True, False])
def test_rollout_of_uniform_attention_is_uniform(class_token):
    depth = 3
    cfg = ViTConfig(img_size=12, patch_size=4, in_chans=3, num_classes=4, width=32, depth=depth, num_heads=4,
                    mlp_dim=32, class_token=class_token, pool="token" if class_token else "gap")
    model = _uniform_attention_model(cfg)
    x = torch.randn(3, 3, 12, 12)
    maps = rollout_maps(model, x, upsample=False)
    t, n = cfg.seq_len, cfg.num_patches
    # ((U + I) / 2)^L = (1 - 2^-L) U + 2^-L I for the uniform matrix U (U^2 = U)
    c = 1 - 0.5 ** depth
    expected = c / t if class_token else c / t + 0.5 ** depth / n
    torch.testing.assert_close(maps, torch.full((3, 3, 3), expected), rtol=1e-6, atol=1e-7)
    up = rollout_maps(model, x)
    assert up.shape == (3, 12, 12)
    torch.testing.assert_close(up, torch.full((3, 12, 12), expected), rtol=1e-6, atol=1e-7)


def test_rollout_one_hot_attention_hand_set():
    """Every token of every layer attends only to patch j: after L layers the class token owes 1 - 2^-L to j."""
    t, j, depth = 10, 4, 3  # class token + a 3x3 grid
    a = torch.zeros(1, 2, t, t)
    a[..., j] = 1.0
    roll = attention_rollout([a] * depth)
    want = torch.zeros(t)
    want[j], want[0] = 1 - 0.5 ** depth, 0.5 ** depth
    torch.testing.assert_close(roll[0, 0], want)
    grid_map = rollout_to_grid(roll, (3, 3), 1)[0]
    assert int(grid_map.argmax()) == j - 1 and grid_map.sum() == pytest.approx(1 - 0.5 ** depth)
    assert torch.count_nonzero(grid_map) == 1
    torch.testing.assert_close(roll.sum(-1), torch.ones(1, t))  # rows stay distributions


def test_head_fusion():
    a = torch.tensor([[[[0.2, 0.8], [0.5, 0.5]], [[0.6, 0.4], [0.1, 0.9]]]])
    torch.testing.assert_close(fuse_heads(a, "mean"), torch.tensor([[[0.4, 0.6], [0.3, 0.7]]]))
    torch.testing.assert_close(fuse_heads(a, "max"), torch.tensor([[[0.6, 0.8], [0.5, 0.9]]]))
    torch.testing.assert_close(fuse_heads(a, "min"), torch.tensor([[[0.2, 0.4], [0.1, 0.5]]]))
    # max fusion: rows renormalised after the identity is added
    roll = attention_rollout([a], "max")
    fused = torch.tensor([[0.6, 0.8], [0.5, 0.9]]) + torch.eye(2)
    torch.testing.assert_close(roll[0], fused / fused.sum(-1, keepdim=True))
    with pytest.raises(ValueError, match="head fusion"):
        fuse_heads(a, "median")
    with pytest.raises(ValueError, match="no attention"):
        attention_rollout([])


def test_rollout_any_resolution_and_patch_shape():
    cfg = ViTConfig(img_size=(16, 24), patch_size=(4, 8), in_chans=3, num_classes=2, width=32, depth=2,
                    num_heads=2, mlp_dim=32, dynamic_img_size=True, dynamic_img_pad=True)
    model = VisionTransformer(cfg).eval()
    with torch.no_grad():
        model.pos_embed.normal_(std=1.0)
    for h, w in [(16, 24), (24, 40), (26, 42)]:  # the built size, a larger one, one needing padding
        x = torch.randn(2, 3, h, w)
        maps = rollout_maps(model, x)
        assert maps.shape == (2, h, w)
        grid = rollout_maps(model, x, upsample=False)
        gh, gw = math.ceil(h / 4), math.ceil(w / 8)
        assert grid.shape == (2, gh, gw)
        assert (grid > 0).all() and (grid.flatten(1).sum(1) < 1).all()  # a share of the class token's inputs
        # rolled out again in float64 numpy from the model's attention: ((A + I) / 2) per layer, last layer
        # first in the product, the class token's row over the patches, row-major on the (rows, cols) grid
        with torch.no_grad():
            layers = model.forward_intermediates(x, output_fmt="dict", return_attention=True)["attention"]
            att = [a.double().mean(1).numpy() for a in layers]
        roll = np.broadcast_to(np.eye(1 + gh * gw), att[0].shape)
        for a in att:
            roll = ((a + np.eye(a.shape[-1])) / 2) @ roll
        want = torch.from_numpy(roll[:, 0, 1:].reshape(2, gh, gw)).float()
        assert want.std() > 1e-3  # the positions make the map vary: a transposed grid would not match
        torch.testing.assert_close(grid, want, rtol=1e-5, atol=1e-7)
        # upsampled over (rows x 4, cols x 8) pixels, the padded border (bottom, right) cropped away
        full = torch.nn.functional.interpolate(want[:, None], size=(gh * 4, gw * 8), mode="bilinear")[:, 0]
        torch.testing.assert_close(maps, full[:, :h, :w], rtol=1e-5, atol=1e-7)


# --- attention distance ----------------------------------------------------------------------------
def test_patch_distances():
    d = patch_distances((2, 2), 16)
    s = 16 * math.sqrt(2)
    torch.testing.assert_close(d, torch.tensor([[0, 16, 16, s], [16, 0, s, 16], [16, s, 0, 16], [s, 16, 16, 0]],
                                               dtype=torch.float64))
    d = patch_distances((1, 3), (4, 8))  # non-square patches: columns are 8 px apart
    torch.testing.assert_close(d[0], torch.tensor([0.0, 8.0, 16.0], dtype=torch.float64))


def test_attention_distance_hand_set():
    # a 1x3 grid of 10 px patches with a class token; head 0 hand-set, head 1 the identity
    a = torch.zeros(1, 2, 4, 4)
    a[0, 0, 1] = torch.tensor([0.5, 0.25, 0.25, 0.0])  # class-token key dropped -> [0.5, 0.5, 0] -> 5 px
    a[0, 0, 2] = torch.tensor([0.0, 0.0, 0.0, 1.0])  # its right neighbour -> 10 px
    a[0, 0, 3] = torch.tensor([0.0, 1.0, 0.0, 0.0])  # two patches left -> 20 px
    a[0, 0, 0] = torch.tensor([1.0, 0.0, 0.0, 0.0])  # the class token's own row is not a query patch
    a[0, 1] = torch.eye(4)
    d = attention_distance(a, (1, 3), 10, num_prefix_tokens=1)
    torch.testing.assert_close(d, torch.tensor([35.0 / 3, 0.0]))
    # uniform attention on a 2x2 grid of 16 px patches: (0 + 16 + 16 + 16 sqrt 2) / 4 from every patch
    u = torch.full((3, 1, 4, 4), 0.25)
    torch.testing.assert_close(attention_distance(u, (2, 2), 16, num_prefix_tokens=0),
                               torch.tensor([(32 + 16 * math.sqrt(2)) / 4]))
    with pytest.raises(ValueError, match="does not match"):
        attention_distance(u, (3, 3), 16, num_prefix_tokens=0)


def test_mean_attention_distance_of_models():
    cfg = ViTConfig(img_size=(12, 16), patch_size=(4, 8), in_chans=3, num_classes=2, width=32, depth=3,
                    num_heads=4, mlp_dim=32)
    model = _uniform_attention_model(cfg)
    x = torch.randn(5, 3, 12, 16)
    d = mean_attention_distance(model, [x[:2], x[2:]])
    assert d.shape == (3, 4)
    torch.testing.assert_close(d, torch.full((3, 4), float(patch_distances((3, 2), (4, 8)).mean())))
    ident = _identity_attention_model(depth=2)
    assert torch.equal(mean_attention_distance(ident, torch.randn(2, 1, 8, 8)), torch.zeros(2, 2))


# --- position-embedding similarity ---------------------------------------------------------------------
def _sincos_closed_form(grid, width):
    """cos-sim of the sincos2d table: each quarter pairs sin/cos of one axis, so the similarity of patches
    (dy, dx) apart is (f(dx) + f(dy)) / 2 with f(d) = mean_k cos(omega_k d)."""
    q = width // 4
    omega = 1.0 / 10000 ** (torch.arange(q, dtype=torch.float64) / (q - 1))
    f = lambda d: torch.cos(omega * d).mean()  # noqa: E731
    gh, gw = grid
    out = torch.zeros(gh, gw, gh, gw, dtype=torch.float64)
    for r in range(gh):
        for c in range(gw):
            for r2 in range(gh):
                for c2 in range(gw):
                    out[r, c, r2, c2] = (f(c - c2) + f(r - r2)) / 2
    return out.float()


def test_sincos2d_similarity_is_the_closed_form_and_decays_with_distance():
    cfg = ViTConfig(img_size=32, patch_size=4, in_chans=3, num_classes=2, width=128, depth=1, num_heads=4,
                    mlp_dim=32, posemb="sincos2d")
    sim = posemb_similarity(VisionTransformer(cfg))
    assert sim.shape == (8, 8, 8, 8)
    torch.testing.assert_close(sim, _sincos_closed_form((8, 8), 128), rtol=0, atol=1e-5)
    by = similarity_by_distance(sim)
    assert by["distance"] == list(range(11)) and by["similarity"][0] == pytest.approx(1.0)
    assert all(a > b for a, b in zip(by["similarity"], by["similarity"][1:]))  # strictly decaying
    assert all(sim[3, 3, 3, 3 + i] > sim[3, 3, 3, 4 + i] for i in range(4))  # along a row, 4 steps out
    near, far = near_far_similarity(sim)
    assert near > far


def test_learn2d_similarity_exact():
    """Orthonormal row and column tables: patches share half their embedding per shared row or column."""
    cfg = ViTConfig(img_size=(12, 16), patch_size=4, in_chans=3, num_classes=2, width=16, depth=1, num_heads=2,
                    mlp_dim=16, posemb="learn2d")
    model = VisionTransformer(cfg)
    with torch.no_grad():
        model.pos_embed_row.copy_(torch.eye(8)[:3][None])
        model.pos_embed_col.copy_(torch.eye(8)[3:7][None])
    sim = posemb_similarity(model)
    r = torch.arange(3)
    c = torch.arange(4)
    want = ((r[:, None, None, None] == r[None, None, :, None]).float()
            + (c[None, :, None, None] == c[None, None, None, :]).float()) / 2
    torch.testing.assert_close(sim, want)


def test_learned_1d_similarity_at_the_trained_grid_and_after_a_resize():
    cfg = ViTConfig(img_size=16, patch_size=4, in_chans=3, num_classes=2, width=32, depth=1, num_heads=2,
                    mlp_dim=16)
    model = VisionTransformer(cfg)
    table = sincos_2d((4, 4), 32)
    with torch.no_grad():
        model.pos_embed[0, 1:] = table
    torch.testing.assert_close(posemb_similarity(model), cosine_similarity_grid(table, (4, 4)))
    big = posemb_similarity(model, grid=(6, 7))
    resized = resize_pos_embed(model.pos_embed, (4, 4), (6, 7))[0, 1:]
    assert big.shape == (6, 7, 6, 7)
    torch.testing.assert_close(big, cosine_similarity_grid(resized, (6, 7)))
    torch.testing.assert_close(big.reshape(42, 42), big.reshape(42, 42).T)
    assert torch.allclose(torch.diagonal(big.reshape(42, 42)), torch.ones(42))


def test_posemb_similarity_refusals():
    for kind in ("none", "relative"):
        cfg = ViTConfig(img_size=16, patch_size=4, width=16, depth=1, num_heads=2, mlp_dim=16, posemb=kind)
        with pytest.raises(ValueError, match="position table"):
            posemb_similarity(VisionTransformer(cfg))
    cfg = ViTConfig(img_size=16, patch_size=4, width=16, depth=3, num_heads=2, mlp_dim=16,
                    posemb_where="every_layer")
    model = VisionTransformer(cfg)
    assert not torch.equal(posemb_similarity(model, table=0), posemb_similarity(model, table=2))
    with pytest.raises(ValueError, match="table 3"):
        posemb_similarity(model, table=3)


# --- embedding filters -----------------------------------------------------------------------------
def test_embedding_filters_recover_planted_components():
    cfg = ViTConfig(img_size=8, patch_size=4, in_chans=3, num_classes=2, width=40, depth=1, num_heads=2,
                    mlp_dim=16)
    model = VisionTransformer(cfg)
    rng = np.random.default_rng(0)
    basis, _ = np.linalg.qr(rng.normal(size=(48, 3)))  # three orthonormal directions in patch space
    coeff, _ = np.linalg.qr(rng.normal(size=(40, 3)) - 0)
    coeff = coeff - coeff.mean(0)  # centred coefficients...
    coeff, _ = np.linalg.qr(coeff)  # ...kept orthonormal (still centred: orthogonal to the ones vector)
    scales = np.array([5.0, 3.0, 1.0])
    w = (coeff * scales) @ basis.T + 0.7  # plus a common offset the centring removes
    with torch.no_grad():
        model.patch_embed.proj.weight.copy_(torch.tensor(w, dtype=torch.float32).reshape(40, 3, 4, 4))
    comps, ratio = embedding_filters(model, 3)
    assert comps.shape == (3, 3, 4, 4)
    torch.testing.assert_close(ratio, torch.tensor(scales ** 2 / (scales ** 2).sum(), dtype=torch.float32),
                               rtol=1e-4, atol=1e-5)
    for i in range(3):
        cos = abs(float(torch.tensor(basis[:, i], dtype=torch.float32) @ comps[i].flatten()))
        assert cos == pytest.approx(1.0, abs=1e-4)
        flat = comps[i].flatten()
        assert flat[flat.abs().argmax()] > 0  # sign convention
    assert embedding_filters(model, 100)[0].shape[0] == 40  # at most D components


# --- the report and the command --------------------------------------------------------------------
def test_analyze_writes_figures_and_json(tmp_path):
    from PIL import Image

    cfg = ViTConfig(img_size=16, patch_size=4, in_chans=3, num_classes=3, width=32, depth=3, num_heads=2,
                    mlp_dim=32)
    model = VisionTransformer(cfg).eval()
    model.meta.labels = ["a", "b", "c"]
    x = torch.randn(3, 3, 16, 16)
    s = analyze(model, x, tmp_path, names=["p", "q", "r"], progress=False)
    for name in ("rollout.png", "attention_distance.png", "posemb_similarity.png", "embedding_filters.png"):
        with Image.open(tmp_path / name) as im:
            assert im.format == "PNG" and im.size[0] > 200
    summary = json.loads((tmp_path / "summary.json").read_text())
    dist = json.loads((tmp_path / "attention_distance.json").read_text())
    assert len(dist["distance_px"]) == 3 and len(dist["distance_px"][0]) == 2
    torch.testing.assert_close(torch.tensor(dist["distance_px"]), mean_attention_distance(model, x))
    table = dist["distance_px"]  # [layer][head]; the extremes are named 1-based, as layer / head numbers
    flat = [(v, layer + 1, head + 1) for layer, row in enumerate(table) for head, v in enumerate(row)]
    low, high = min(flat), max(flat)
    assert dist["most_local_head"] == {"layer": low[1], "head": low[2], "distance_px": low[0]}
    assert dist["least_local_head"] == {"layer": high[1], "head": high[2], "distance_px": high[0]}
    assert summary["attention_distance"]["most_local_head"] == dist["most_local_head"]
    assert summary["rollout"]["images"] == ["p", "q", "r"] and len(summary["predictions"]) == 3
    assert summary["posemb_similarity"]["grid"] == [4, 4]
    assert len(summary["embedding_filters"]["explained_variance"]) == 28
    assert s["tensors"]["rollout"].shape == (3, 16, 16)


def test_plots_need_matplotlib(monkeypatch, tmp_path):
    import sys

    from vitkit.analysis.plots import plot_attention_distance
    from vitkit.errors import MissingDependency
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(MissingDependency, match=r"pip install 'vitkit\[plots\]'"):
        plot_attention_distance(torch.zeros(2, 2), tmp_path / "x.png")
    cfg = ViTConfig(img_size=8, patch_size=4, width=16, depth=1, num_heads=2, mlp_dim=16)
    with pytest.raises(MissingDependency, match="matplotlib"):  # the CLI turns this into one clean error line
        analyze(VisionTransformer(cfg), torch.randn(1, 3, 8, 8), tmp_path)
    assert not list(tmp_path.iterdir())  # failed before doing any work
    analyze(VisionTransformer(cfg), torch.randn(1, 3, 8, 8), tmp_path, plots=False, progress=False)
    assert (tmp_path / "summary.json").is_file() and not list(tmp_path.glob("*.png"))


def test_analyze_command_on_real_photos(tmp_path, capsys):
    skdata = pytest.importorskip("skimage.data")
    from PIL import Image

    from vitkit.checkpoints import save_model
    from vitkit.cli import main

    for name in ("chelsea", "coffee"):
        Image.fromarray(getattr(skdata, name)()).save(tmp_path / f"{name}.png")
    cfg = ViTConfig(img_size=32, patch_size=8, in_chans=3, num_classes=2, width=32, depth=2, num_heads=2,
                    mlp_dim=32)
    save_model(VisionTransformer(cfg), tmp_path / "ckpt", labels=["x", "y"],
               preprocessing={"name": "hf", "size": [32, 32], "resize": None, "resize_mode": "squash",
                              "interpolation": "bilinear", "backend": "pil", "mean": [0.5] * 3, "std": [0.5] * 3})
    out = tmp_path / "out"
    assert main(["analyze", str(tmp_path / "ckpt"), str(tmp_path / "chelsea.png"), str(tmp_path / "coffee.png"),
                 "--out", str(out), "--img-size", "48", "--head-fusion", "max"]) == 0
    printed = capsys.readouterr().out
    assert "mean attention distance per layer" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rollout"]["images"] == ["chelsea.png", "coffee.png"]
    assert summary["rollout"]["head_fusion"] == "max"
    assert summary["posemb_similarity"]["grid"] == [6, 6]  # analysed at 48 px: the table was resized
    assert summary["attention_distance"]["num_images"] == 2
    assert main(["analyze", str(tmp_path / "ckpt"), "--out", str(out)]) == 2  # a usage error
    assert "IMAGE" in capsys.readouterr().err


# --- on a small ViT trained on Fashion-MNIST ---------------------------------------------------------
@pytest.mark.slow
def test_trained_attention_distance_grows_with_depth(small_trained_vit):
    model, _, (test_x, _) = small_trained_vit
    from vitkit.eval import prepare_images
    x = prepare_images(test_x[:128], model.config.img_size, 1, model.meta.preprocessing)
    d = mean_attention_distance(model, [x[:64], x[64:]])
    per_layer = d.mean(dim=1)
    depth = torch.arange(len(per_layer), dtype=torch.float32)
    slope = float(((depth - depth.mean()) * (per_layer - per_layer.mean())).sum() / ((depth - depth.mean()) ** 2).sum())
    assert slope > 0, per_layer.tolist()
    half = len(per_layer) // 2
    assert per_layer[half:].mean() > per_layer[:half].mean(), per_layer.tolist()


@pytest.mark.slow
def test_trained_position_embeddings_are_local(small_trained_vit):
    model = small_trained_vit[0]
    sim = posemb_similarity(model)
    near, far = near_far_similarity(sim)
    assert near > far + 0.1, (near, far)
    by = similarity_by_distance(sim)["similarity"]  # grid distance 0, 1, 2, ...
    assert by[1] > by[2] > by[3], by
