"""A small, easy image classification task for training tests: the bright quadrant is the class."""
import numpy as np


def quadrant_images(n, size=16, seed=0, classes=4):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    x = rng.integers(0, 60, (n, 1, size, size)).astype(np.uint8)
    h = size // 2
    for i, c in enumerate(labels):
        r, q = divmod(int(c) % 4, 2)
        x[i, 0, r * h:(r + 1) * h, q * h:(q + 1) * h] += 150
    return x, labels.astype(np.int64)


def write_npz(path, n_train=576, n_test=128, size=16, classes=4):
    """Training images of which the tiny recipe holds out 64 for validation (512 left: 16 steps of 32 per
    epoch), and test images."""
    xtr, ytr = quadrant_images(n_train, size, 0, classes)
    xte, yte = quadrant_images(n_test, size, 1, classes)
    np.savez(path, train_images=xtr, train_labels=ytr, test_images=xte, test_labels=yte,
             classes=np.array([f"q{i}" for i in range(classes)]))
    return path


TINY_RECIPE = """
name: tiny-test
model: {{img_size: 16, patch_size: 4, width: 32, depth: 2, num_heads: 2, mlp_dim: 64, pool: gap, class_token: false}}
data: {{dataset: "tensors:{data}", mean: [0.2], std: [0.3], eval_batch_size: 64, val_size: {val_size}}}
augment: {{crop: pad, pad: 2, flip: false, label_smoothing: 0.1, erasing: 0.2}}
optim: {{name: adamw, lr: 5.0e-3, batch_size: 32, weight_decay: 0.05}}
schedule: {{epochs: 6, warmup_steps: 4, decay: cosine}}
train: {{ema: 0.9, eval_every: 1, ckpt_every: 4, log_every: 4, threads: 1, predictions: 4}}
"""


def write_recipe(folder, data, val_size=64, **fmt):
    """The tiny recipe on ``data``, holding out ``val_size`` training images for validation (null: none)."""
    p = folder / "tiny.yaml"
    p.write_text(TINY_RECIPE.format(data=data, val_size="null" if val_size is None else val_size, **fmt))
    return p
