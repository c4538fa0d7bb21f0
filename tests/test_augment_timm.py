"""vitkit's batched augmentation against timm's on the same inputs: Mixup / CutMix with the same draw give
timm's images, targets and loss; RandAugment's magnitude noise has timm's distribution, drawn per image."""
import math

import numpy as np
import pytest
import torch

from vitkit.data.augment import MixDraw, apply_mix, draw_mix, one_hot, rand_augment
from vitkit.train.step import classification_loss

pytestmark = pytest.mark.peers
timm_mixup = pytest.importorskip("timm.data.mixup")
auto_augment = pytest.importorskip("timm.data.auto_augment")
SoftTargetCrossEntropy = pytest.importorskip("timm.loss").SoftTargetCrossEntropy

K, SMOOTH = 7, 0.1


def _timm_mix(monkeypatch, x, labels, d: MixDraw, cutmix: bool):
    """timm's Mixup (batch mode, exact CutMix area) on ``x`` with vitkit's draw ``d`` in place of numpy's."""
    monkeypatch.setattr(timm_mixup.np.random, "beta", lambda a, b: d.lam)
    centre = iter(d.centre or ())
    monkeypatch.setattr(timm_mixup.np.random, "randint", lambda lo, hi, size=None: next(centre))
    m = timm_mixup.Mixup(mixup_alpha=0.0 if cutmix else 0.8, cutmix_alpha=1.0 if cutmix else 0.0,
                         label_smoothing=SMOOTH, num_classes=K)
    return m(x.clone(), labels)


@pytest.mark.parametrize("cutmix", [False, True])
def test_mixup_and_cutmix_with_the_same_draw_give_timms_images_targets_and_loss(monkeypatch, cutmix):
    size = (15, 13)  # odd sides: the box's far edge is where implementations differ
    odd_boxes = 0
    for seed in range(24):
        g = torch.Generator().manual_seed(seed)
        x, labels = torch.rand(8, 3, *size, generator=g), torch.randint(0, K, (8,), generator=g)
        d = draw_mix(g, size, mixup=0.0 if cutmix else 0.8, cutmix=1.0 if cutmix else 0.0)
        ours_x, ours_t = apply_mix(x, one_hot(labels, K), d)
        timm_x, timm_t = _timm_mix(monkeypatch, x, labels, d, cutmix)
        assert torch.allclose(ours_x, timm_x, atol=1e-6, rtol=0), seed
        # vitkit smooths in the loss (torch's cross-entropy), timm in the targets: the same targets and loss
        assert torch.allclose(ours_t * (1 - SMOOTH) + SMOOTH / K, timm_t, atol=1e-6, rtol=0), seed
        logits = torch.randn(8, K, generator=g)
        ours_loss = classification_loss(logits, ours_t, SMOOTH)
        assert math.isclose(float(ours_loss), float(SoftTargetCrossEntropy()(logits, timm_t)), rel_tol=1e-5)
        odd_boxes += cutmix and int(size[0] * math.sqrt(1 - d.lam)) % 2 == 1
    assert not cutmix or odd_boxes >= 3  # the odd box sides were exercised


def _magnitudes_timm(n: int, std: float, prob: float) -> np.ndarray:
    """timm's magnitudes (out of 10) of ``n`` draws of RandAugment's brightness op at M9, read back from a grey
    image: factor = 1 +- 0.9 * M / 10 (0: not applied)."""
    from PIL import Image

    op = auto_augment.AugmentOp("BrightnessIncreasing", prob=prob, magnitude=9, hparams={"magnitude_std": std})
    img = Image.new("L", (2, 2), 128)
    return np.array([abs(op(img).getpixel((0, 0)) / 128 - 1) / 0.9 * 10 for _ in range(n)])


def _magnitudes_ours(n: int, std: float, prob: float) -> np.ndarray:
    """vitkit's, from one batch of ``n`` grey images (to 8 bits as the PIL image is)."""
    x = torch.full((n, 1, 2, 2), 128 / 255)
    out = rand_augment(x, torch.Generator().manual_seed(0), num_ops=1, magnitude=9, ops=("brightness",),
                       magnitude_std=std, prob=prob)
    pix = (out[:, 0, 0, 0].double() * 255 + 1e-4).floor()  # as PIL computes the blend: truncated
    return ((pix / 128 - 1).abs() / 0.9 * 10).numpy()


@pytest.mark.parametrize("std, prob", [(2.0, 1.0), (float("inf"), 1.0), (0.5, 0.5)])  # the last: DeiT's
def test_randaugment_magnitude_noise_and_op_probability_are_timms_per_image(std, prob):
    from scipy.stats import ks_2samp

    ours, theirs = _magnitudes_ours(3000, std, prob), _magnitudes_timm(3000, std, prob)
    assert ours.std() > 0.4  # drawn for each image of the batch, not once for the batch
    assert ks_2samp(ours, theirs).pvalue > 1e-3
    assert ours.min() >= 0 and ours.max() <= 10 + 0.1
    if std == 2.0:  # clipped at 10: about P(z > 0.5) = 31% of the draws sit there, in both
        at_top = [float(np.mean(m > 9.95)) for m in (ours, theirs)]
        assert abs(at_top[0] - at_top[1]) < 0.05 and 0.25 < at_top[1] < 0.37, at_top
    if prob < 1:  # the images an op left alone
        untouched = [float(np.mean(m == 0)) for m in (ours, theirs)]
        assert abs(untouched[0] - untouched[1]) < 0.05 and abs(untouched[1] - (1 - prob)) < 0.04, untouched
