"""Axial-ViT (Appendix D.6): a config field, not a class; shapes, the row-then-column wiring, parameter
count and multiply-adds against hand counts and torch's FLOP counter; the BiT ResNet classifier (depth 0)."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from vitkit import ViTConfig
from vitkit.config import ConfigError
from vitkit.models import VisionTransformer
from vitkit.models.cost import cost, param_count
from vitkit.models.kernel_plan import use_backend


def axial_cfg(**kw):
    base = dict(img_size=(8, 12), patch_size=4, in_chans=1, num_classes=3, width=8, depth=1, num_heads=2,
                mlp_dim=16, pool="gap", class_token=False, posemb="learn", attention="axial")
    return ViTConfig(**{**base, **kw})


def test_axial_shapes_and_intermediates():
    cfg = axial_cfg(depth=2)
    m = VisionTransformer(cfg).eval()
    x = torch.randn(3, 1, 8, 12)
    assert m(x).shape == (3, 3)
    out = m.forward_intermediates(x, output_fmt="dict")
    assert [t.shape for t in out["intermediates"]] == [(3, 6, 8)] * 2 and out["grid"] == (2, 3)
    with pytest.raises(ValueError, match="no \\[tokens, tokens\\] attention"):
        m.forward_intermediates(x, output_fmt="dict", return_attention=True)


def test_axial_block_is_row_blocks_then_column_blocks():
    torch.manual_seed(1)
    m = VisionTransformer(axial_cfg()).eval()
    blk = m.blocks[0]
    x = torch.randn(2, 6, 8)  # a 2x3 grid, row-major
    got = blk(x, grid=(2, 3))[0]
    grid = x.reshape(2, 2, 3, 8).clone()
    for r in range(2):  # each row is its own 3-token sequence
        grid[:, r] = blk.row(grid[:, r])[0]
    for c in range(3):  # then each column its own 2-token sequence
        grid[:, :, c] = blk.col(grid[:, :, c])[0]
    torch.testing.assert_close(got, grid.reshape(2, 6, 8))
    # a row block alone never mixes rows
    y = x.clone()
    y[:, 3:] += 1.0  # change row 1 only
    torch.testing.assert_close(blk.row(x.reshape(4, 3, 8))[0].reshape(2, 6, 8)[:, :3],
                               blk.row(y.reshape(4, 3, 8))[0].reshape(2, 6, 8)[:, :3])


def test_axial_parameters_and_macs_by_hand():
    cfg = axial_cfg()
    # patch embedding 1*4*4*8 + 8; position table 6*8; per block LN 4*8 + qkv 3*8*8+24 + proj 8*8+8
    # + MLP 8*16+16+16*8+8 = 600, two blocks (row, column); final LN 16; head 8*3+3
    hand_params = 136 + 48 + 2 * 600 + 16 + 27
    assert param_count(cfg) == hand_params == VisionTransformer(cfg).num_params()
    # t = 6 tokens; qkv 2*6*8*24, scores and values 6*(3+2)*8 each (a row of 3, a column of 2),
    # out projection 2*6*8*8, MLP 2*2*6*8*16, patch embedding 6*16*8, head 8*3
    hand_macs = 2304 + 2 * 240 + 768 + 3072 + 768 + 24
    assert cost(cfg).macs == hand_macs
    with use_backend(gemm="onednn", attention="explicit"):  # the plan of a model built inside
        m = VisionTransformer(cfg).eval()
    assert m.kernel_plan.attention_for(torch.float32, grad=False) == "explicit"
    with FlopCounterMode(display=False) as fc:
        # the explicit attention path: torch counts its products, not the CPU kernel's; oneDNN planned but
        # the counter gets ATen's GEMMs
        m(torch.randn(1, 1, 8, 12))
    assert fc.get_total_flops() == 2 * hand_macs
    glob = cfg.replace(attention="global")  # one block per layer, every token attends to all 6
    assert param_count(glob) == 136 + 48 + 600 + 16 + 27
    assert cost(glob).macs == 1152 + 2 * 6 * 6 * 8 + 384 + 1536 + 768 + 24


def test_axial_trains_and_rejects_what_it_cannot_do():
    m = VisionTransformer(axial_cfg(depth=2))
    m.head.weight.data.normal_(std=0.1)
    loss = m(torch.randn(4, 1, 8, 12)).logsumexp(-1).mean()
    loss.backward()
    assert all(p.grad is not None for p in m.blocks[0].row.parameters())
    assert all(p.grad is not None for p in m.blocks[0].col.parameters())
    for bad in (dict(pool="token", class_token=True), dict(posemb="relative"), dict(patch_drop=0.5)):
        with pytest.raises(ConfigError, match="axial"):
            axial_cfg(**bad)
    with pytest.raises(ConfigError, match="attention"):
        axial_cfg(attention="window")
    from vitkit.models.inference import prepare_inference
    with pytest.raises(ValueError, match="axial"):
        prepare_inference(m)


def test_resnet_classifier_is_depth_zero_with_a_backbone():
    cfg = ViTConfig(img_size=28, in_chans=1, num_classes=10, backbone="resnet", backbone_layers=(2, 2),
                    backbone_width=32, patch_size=1, width=128, depth=0, num_heads=4, posemb="none", pool="gap",
                    class_token=False)
    m = VisionTransformer(cfg)
    assert len(m.blocks) == 0 and m(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert param_count(cfg) == m.num_params()
    with FlopCounterMode(display=False) as fc:
        m.eval()(torch.randn(1, 1, 28, 28))
    assert fc.get_total_flops() == 2 * cost(cfg).macs
    with pytest.raises(ConfigError, match="depth=0"):
        cfg.replace(posemb="learn")
    with pytest.raises(ConfigError, match="depth"):
        ViTConfig(depth=0)  # without a backbone there is no model
