"""A small ViT trained briefly on Fashion-MNIST with a plain PyTorch loop, for the slow analysis tests.

Independent of the training engine on purpose: the tests of the analysis
instruments should not break when a recipe changes. Trained once per test
session (``small_trained_vit`` fixture in conftest.py).
"""
from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from vitkit import VisionTransformer, ViTConfig

CONFIG = ViTConfig(img_size=28, patch_size=4, in_chans=1, num_classes=10, width=64, depth=4, num_heads=4,
                   mlp_dim=128, name="test-fmnist-vit")  # class token, learned 1D position embeddings
MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST training-set statistics
BATCH = 64
STEPS = 300  # 19,200 training images seen once: about a minute on 2 cores
LR = 2e-3
TEST_IMAGES = 2000


def train_small_vit(seed: int = 0):
    """(model in eval mode, (train uint8 [N, 28, 28], labels), (test uint8, labels))."""
    from vitkit.data import load_fashion_mnist

    train_x, train_y = load_fashion_mnist("train")
    test_x, test_y = load_fashion_mnist("test")
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(train_y), generator=g)[:BATCH * STEPS]
    x = (torch.from_numpy(train_x)[order].float().div_(255).sub_(MEAN).div_(STD)).unsqueeze(1)
    y = torch.from_numpy(train_y)[order]
    model = VisionTransformer(CONFIG)
    with torch.no_grad():  # the paper's zero head blocks the backbone's gradients at step 0; start it small
        model.head.weight.normal_(std=0.02)
    no_decay = model.no_weight_decay()
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW([{"params": [p for n, p in params.items() if n not in no_decay], "weight_decay": 0.05},
                             {"params": [p for n, p in params.items() if n in no_decay], "weight_decay": 0.0}],
                            lr=LR)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, LR, total_steps=STEPS, pct_start=0.1)
    model.train()
    t0 = time.perf_counter()
    for step in range(STEPS):
        batch = slice(step * BATCH, (step + 1) * BATCH)
        loss = F.cross_entropy(model(x[batch]), y[batch])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()
    model.meta.preprocessing = {"mean": [MEAN], "std": [STD]}
    model.train_seconds = time.perf_counter() - t0
    return model, (train_x, np.asarray(train_y)), (test_x[:TEST_IMAGES], np.asarray(test_y[:TEST_IMAGES]))
