"""Batched augmentation: geometry, determinism, label mixing, erasing, RandAugment."""
import math

import pytest
import torch
import torch.nn.functional as F

from vitkit.data.augment import (
    AugmentConfig,
    BatchAugment,
    EvalTransform,
    Normalize,
    equalize,
    flip,
    inception_crop,
    mix,
    one_hot,
    pad_crop,
    rand_augment,
    random_erasing,
)
from vitkit.data.loader import EpochSampler


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _batch(b=8, c=1, h=12, w=12):
    return torch.randint(0, 256, (b, c, h, w), dtype=torch.uint8)


def test_pad_crop_is_a_shifted_window_of_the_padded_image():
    x = _batch()
    out = pad_crop(x, 2, _gen())
    assert out.shape == x.shape and out.dtype == x.dtype
    xp = F.pad(x, (2, 2, 2, 2))
    for i in range(len(x)):  # every output is exactly one of the 25 windows
        windows = [xp[i, :, dy:dy + 12, dx:dx + 12] for dy in range(5) for dx in range(5)]
        assert any(torch.equal(out[i], w) for w in windows)
    assert not all(torch.equal(out[i], x[i]) for i in range(len(x)))  # not all unshifted


def test_flip_flips_a_random_subset_exactly():
    x = _batch(64)
    out = flip(x, _gen())
    flipped = [torch.equal(out[i], x[i].flip(-1)) for i in range(64)]
    kept = [torch.equal(out[i], x[i]) for i in range(64)]
    assert all(f or k for f, k in zip(flipped, kept))
    assert 16 < sum(flipped) < 48


def test_inception_crop_full_area_square_is_identity_and_flip_is_folded():
    x = torch.rand(4, 3, 16, 16)
    out = inception_crop(x, (16, 16), _gen(), scale=(1.0, 1.0), ratio=(1.0, 1.0))
    assert torch.allclose(out, x, atol=1e-5)
    out = inception_crop(x, (16, 16), _gen(), scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=1.0)
    assert torch.allclose(out, x.flip(-1), atol=1e-5)


def test_inception_crop_zooms_in_on_a_region():
    # a horizontal ramp: a crop covering a fraction of the width has a smaller value range
    ramp = torch.linspace(0, 1, 64).expand(2, 1, 64, 64).contiguous()
    out = inception_crop(ramp, (32, 32), _gen(3), scale=(0.1, 0.1), ratio=(1.0, 1.0))
    span = out.amax(dim=(1, 2, 3)) - out.amin(dim=(1, 2, 3))
    assert torch.all(span < 0.45) and torch.all(span > 0.2)  # sqrt(0.1) ~ 0.32 of the width


def test_same_generator_same_augmentation():
    cfg = AugmentConfig(crop="pad", pad=2, flip=True, randaugment=(2, 9), erasing=0.5, mixup=0.2, cutmix=1.0)
    aug = BatchAugment(cfg, (12, 12), 10, Normalize([0.5], [0.5], 1))
    x, y = _batch(16), torch.randint(0, 10, (16,))
    a1, t1 = aug(x, y, _gen(5))
    a2, t2 = aug(x, y, _gen(5))
    a3, _ = aug(x, y, _gen(6))
    assert torch.equal(a1, a2) and torch.equal(t1, t2)
    assert not torch.equal(a1, a3)
    assert t1.shape == (16, 10) and torch.allclose(t1.sum(1), torch.ones(16))


def test_mixup_mixes_images_and_targets_with_the_same_weight():
    x = torch.rand(6, 1, 8, 8)
    t = one_hot(torch.arange(6), 6)
    out, tt = mix(x, t, _gen(1), mixup=1.0)
    lam = float(tt[0, 0])
    assert 0 < lam < 1
    assert torch.allclose(out, lam * x + (1 - lam) * x.flip(0), atol=1e-6)
    assert torch.allclose(tt[0, 5], torch.tensor(1 - lam))


def test_cutmix_target_weight_is_the_pasted_area():
    x = torch.zeros(4, 1, 16, 16)
    x[2:] = 1.0  # reverse partners of images 0,1 are ones
    t = one_hot(torch.tensor([0, 1, 2, 3]), 4)
    out, tt = mix(x, t, _gen(2), cutmix=1.0)
    pasted = float(out[0].mean())  # fraction of image 0 taken from its partner (all ones)
    assert pasted > 0
    assert math.isclose(float(tt[0, 3]), pasted, abs_tol=1e-6)
    assert math.isclose(float(tt[0, 0]), 1 - pasted, abs_tol=1e-6)


def test_random_erasing_rectangles():
    x = torch.full((32, 1, 16, 16), 7.0)
    assert torch.equal(random_erasing(x, _gen(), p=0.0), x)
    out = random_erasing(x, _gen(), p=1.0)
    changed = (out != 7.0)
    assert changed.flatten(1).any(1).all()  # every image got a rectangle
    for i in range(32):  # it is a rectangle: the changed rows x changed cols box is fully changed
        rows = changed[i, 0].any(1).nonzero().flatten()
        cols = changed[i, 0].any(0).nonzero().flatten()
        box = changed[i, 0, rows.min():rows.max() + 1, cols.min():cols.max() + 1]
        assert box.float().mean() > 0.99  # (noise equal to 7.0 has probability ~0)


def test_rand_augment_keeps_range_shape_and_changes_images():
    x = torch.rand(32, 3, 16, 16)
    out = rand_augment(x, _gen(), num_ops=2, magnitude=9)
    assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1
    assert (out - x).abs().flatten(1).amax(1).gt(1e-3).float().mean() > 0.5
    with pytest.raises(ValueError, match="unknown RandAugment ops"):
        rand_augment(x, _gen(), ops=("rotate", "warp"))


def test_equalize_spreads_a_narrow_histogram():
    x = (torch.rand(2, 1, 16, 16) * 0.2 + 0.4)
    out = equalize(x)
    assert out.min() < 0.05 and out.max() > 0.95
    # order is preserved
    a, b = x.flatten(), out.flatten()
    i, j = a.argsort()[:10], a.argsort()[-10:]
    assert b[i].max() <= b[j].min()
    # by hand: levels 100, 130, 200 (counts 2, 1, 1): cdf 2, 3, 4, so (cdf - 2) / (4 - 2) -> 0, 1/2, 1
    img = torch.tensor([100, 100, 130, 200], dtype=torch.float32).view(1, 1, 2, 2) / 255
    torch.testing.assert_close(equalize(img), torch.tensor([0.0, 0.0, 127.5 / 255, 1.0]).view(1, 1, 2, 2))
    # channels and images are equalised separately: a second channel with other levels does not move the first
    two = torch.cat([img, torch.tensor([10, 20, 20, 250], dtype=torch.float32).view(1, 1, 2, 2) / 255], 1)
    torch.testing.assert_close(equalize(torch.cat([two, two.flip(1)]))[0, 0], equalize(img)[0, 0])
    torch.testing.assert_close(equalize(two)[0, 1], torch.tensor([[0.0, 2 / 3], [2 / 3, 1.0]]))  # cdf 1, 3, 4


def test_label_smoothing_and_soft_targets_in_the_loss():
    from vitkit.train.step import classification_loss

    logits = torch.randn(5, 4)
    y = torch.tensor([0, 1, 2, 3, 0])
    manual = -(((1 - 0.1) * one_hot(y, 4) + 0.1 / 4) * logits.log_softmax(1)).sum(1).mean()
    assert torch.allclose(classification_loss(logits, y, 0.1), manual, atol=1e-6)
    assert torch.allclose(classification_loss(logits, one_hot(y, 4), 0.1), manual, atol=1e-6)


def test_repeated_augmentation_sampler_repeats_and_keeps_epoch_length():
    s = EpochSampler(30, 6, seed=1, repeats=3)
    order = s.order(0)
    assert len(order) == 30
    assert all(len(set(order[i:i + 3].tolist())) == 1 for i in range(0, 30, 3))
    assert len(set(order.tolist())) == 10


def test_normalize_channels_and_eval_transform():
    n = Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25], channels=3)
    gray = torch.full((2, 1, 4, 4), 255, dtype=torch.uint8)
    out = EvalTransform((8, 8), n)(gray)
    assert out.shape == (2, 3, 8, 8) and torch.allclose(out, torch.full_like(out, 2.0))
    # per-channel statistics, each on its own channel (a constant grey image cannot show a mix-up)
    rgb = torch.randint(0, 256, (2, 3, 5, 6), dtype=torch.uint8)
    mean, std = [0.1, 0.5, 0.8], [0.2, 0.4, 0.1]
    out = EvalTransform((5, 6), Normalize(mean, std, channels=3))(rgb)
    want = (rgb.double() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    torch.testing.assert_close(out, want.float(), rtol=1e-5, atol=1e-5)
    # RGB for a one-channel model: ITU-R 601 luma, then the one mean/std
    gray = Normalize([0.4], [0.2], channels=1)(rgb.float() / 255)
    luma = (0.299 * rgb[:, 0] + 0.587 * rgb[:, 1] + 0.114 * rgb[:, 2]).double() / 255
    torch.testing.assert_close(gray[:, 0], ((luma - 0.4) / 0.2).float(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="2 means"):
        Normalize([0.1, 0.2], [0.1, 0.2])(torch.rand(1, 3, 2, 2))
    with pytest.raises(ValueError, match="augment.crop"):
        AugmentConfig(crop="random")
