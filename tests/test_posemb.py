import numpy as np
import pytest
import torch
from scipy import ndimage

from vitkit.models.posemb import RelativePositionBias, infer_square_grid, resize_grid, resize_pos_embed, sincos_2d


@pytest.mark.parametrize("old,new", [((14, 14), (24, 24)), ((7, 5), (11, 13)), ((3, 4), (2, 2)),
                                     ((8, 8), (12, 12)), ((1, 6), (4, 9)), ((12, 10), (5, 17))])
def test_bilinear_resize_equals_scipy_zoom_order1(old, new):
    """The authors resize with scipy.ndimage.zoom(order=1); ours must give the same numbers."""
    rng = np.random.default_rng(0)
    grid = rng.standard_normal((*old, 6))
    zoom = (new[0] / old[0], new[1] / old[1], 1)
    expected = ndimage.zoom(grid, zoom, order=1)
    assert expected.shape[:2] == new
    ours = resize_grid(torch.from_numpy(grid), new, "bilinear").numpy()
    np.testing.assert_allclose(ours, expected, rtol=1e-10, atol=1e-10)
    # through the position-table API, in float32, class slot first
    table = torch.from_numpy(np.concatenate([rng.standard_normal((1, 6)), grid.reshape(-1, 6)])).float()[None]
    resized = resize_pos_embed(table, old, new, num_prefix_tokens=1)
    assert resized.shape == (1, 1 + new[0] * new[1], 6)
    np.testing.assert_allclose(resized[0, 1:].numpy(), expected.reshape(-1, 6), rtol=1e-5, atol=1e-5)
    assert torch.equal(resized[:, 0], table[:, 0])  # class-token slot untouched


def test_resize_without_prefix_and_several_tables():
    table = torch.randn(3, 4 * 6, 8)
    out = resize_pos_embed(table, (4, 6), (8, 3), num_prefix_tokens=0)
    assert out.shape == (3, 24, 8)
    torch.testing.assert_close(out[1], resize_pos_embed(table[1:2], (4, 6), (8, 3), 0)[0])


def test_bicubic_option_matches_torch_half_pixel_bicubic():
    grid = torch.randn(1, 5, 5, 4)
    out = resize_grid(grid, (9, 9), "bicubic")
    ref = torch.nn.functional.interpolate(grid.permute(0, 3, 1, 2), size=(9, 9), mode="bicubic",
                                          align_corners=False).permute(0, 2, 3, 1)
    torch.testing.assert_close(out, ref)
    assert not torch.allclose(out, resize_grid(grid, (9, 9), "bilinear"))


def test_resize_errors():
    table = torch.randn(1, 1 + 12, 8)
    with pytest.raises(ValueError, match=r"13 slots but old grid 4x4 plus 1 prefix token\(s\) needs 17"):
        resize_pos_embed(table, (4, 4), (6, 6))
    with pytest.raises(ValueError, match="not square, pass the original grid"):
        infer_square_grid(13, 1)
    assert infer_square_grid(197, 1) == (14, 14)
    with pytest.raises(ValueError, match="two positive ints"):
        resize_pos_embed(table, (3, 4), (0, 6))
    with pytest.raises(ValueError, match="unknown resize method"):
        resize_grid(torch.randn(1, 2, 2, 3), (3, 3), "nearest-ish")


def test_bf16_tables_are_resized_in_float32_and_keep_dtype():
    # 14x14 -> 37x37: a size where interpolating in bf16 itself rounds differently (at 4x4 -> 6x6 it does
    # not, and the comparison could not fail)
    table = torch.randn(1, 1 + 14 * 14, 8).bfloat16()
    out = resize_pos_embed(table, (14, 14), (37, 37))
    assert out.dtype == torch.bfloat16
    ref = resize_pos_embed(table.float(), (14, 14), (37, 37)).bfloat16()
    assert torch.equal(out, ref)
    grid = table[:, 1:].reshape(1, 14, 14, 8).permute(0, 3, 1, 2)
    in_bf16 = torch.nn.functional.interpolate(grid, size=(37, 37), mode="bilinear", align_corners=True)
    assert in_bf16.dtype == torch.bfloat16 and not torch.equal(in_bf16.permute(0, 2, 3, 1).reshape(1, -1, 8),
                                                               out[:, 1:])


def test_sincos_similarity_decays_with_grid_distance():
    pe = sincos_2d((10, 10), 64)
    assert pe.shape == (100, 64)
    sim = torch.nn.functional.cosine_similarity(pe[:, None], pe[None], dim=-1).reshape(10, 10, 10, 10)
    centre = sim[5, 5]
    for d in range(1, 4):
        assert centre[5, 5 + d] < centre[5, 5 + d - 1]
        assert centre[5 + d, 5] < centre[5 + d - 1, 5]
    # sin x, cos x, sin y, cos y layout: the first quarter depends on the column only
    assert torch.allclose(pe.reshape(10, 10, 64)[0, :, :16], pe.reshape(10, 10, 64)[7, :, :16])


def test_sincos_values_are_big_visions_formula():
    """posemb_sincos_2d of big_vision, written out in numpy, on a non-square grid (3 rows, 5 columns)."""
    gh, gw, width = 3, 5, 16
    y, x = np.mgrid[:gh, :gw]
    omega = 1.0 / 10000.0 ** (np.arange(width // 4) / (width // 4 - 1))
    y, x = y.reshape(-1, 1) * omega, x.reshape(-1, 1) * omega
    want = np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)
    np.testing.assert_allclose(sincos_2d((gh, gw), width).numpy(), want, rtol=0, atol=1e-6)


def test_relative_bias_depends_only_on_offset():
    rel = RelativePositionBias((3, 4), num_heads=2, class_token=True)
    torch.nn.init.normal_(rel.table)
    torch.nn.init.normal_(rel.cls)
    bias = rel()
    assert bias.shape == (2, 13, 13)
    # patches (0,0)->(1,2) and (1,1)->(2,3) share the offset (-1,-2)
    q1, k1, q2, k2 = 1 + 0, 1 + 1 * 4 + 2, 1 + 1 * 4 + 1, 1 + 2 * 4 + 3
    torch.testing.assert_close(bias[:, q1, k1], bias[:, q2, k2])
    torch.testing.assert_close(bias[:, 0, 5], rel.cls[:, 0])
    torch.testing.assert_close(bias[:, 5, 0], rel.cls[:, 1])
    torch.testing.assert_close(bias[:, 0, 0], rel.cls[:, 2])
    # over all pairs: equal biases exactly where the 2D offsets are equal (the table's values are distinct),
    # so no pair reads another offset's entry (rows and columns swapped, |offset|, a flattened index)
    ys, xs = torch.arange(12) // 4, torch.arange(12) % 4
    offset = torch.stack([ys[:, None] - ys[None, :], xs[:, None] - xs[None, :]], -1).reshape(144, 2)
    same_offset = (offset[:, None] == offset[None, :]).all(-1)
    for h in range(2):
        b = bias[h, 1:, 1:].reshape(144)
        assert torch.equal(b[:, None] == b[None, :], same_offset)
    assert len(torch.unique(bias[0, 1:, 1:])) == 5 * 7  # every offset of a 3x4 grid is used
    # zero offset everywhere on the diagonal
    torch.testing.assert_close(torch.diagonal(bias[:, 1:, 1:], dim1=1, dim2=2),
                               rel.table[:, 2, 3][:, None].expand(2, 12))
