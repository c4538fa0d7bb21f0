"""A timm user's code runs unchanged on a vitkit model (peers environment: timm itself calls it): the same
attributes, calls and return shapes as timm's own model built from the same weights, with the same values, and
timm's data pipeline resolving the model's own preprocessing."""
import copy
import dataclasses

import pytest
import torch

import vitkit
from test_checkpoints_torch import randomize, rel_err

pytestmark = pytest.mark.peers
timm = pytest.importorskip("timm")

CASES = [("vit_small_patch16_224", dict(depth=3, img_size=64)),
         ("vit_small_patch14_reg4_dinov2", dict(depth=3, img_size=56)),
         ("deit3_small_patch16_224", dict(depth=3, img_size=64))]


def _pair(tmp_path, name, kw):
    ref = randomize(timm.create_model(name, pretrained=False, **kw)).eval()
    torch.save(ref.state_dict(), tmp_path / "ref.pth")
    return ref, vitkit.create_model(name, weights=tmp_path / "ref.pth").eval()


@pytest.mark.parametrize("name,kw", CASES, ids=[n for n, _ in CASES])
def test_timm_attributes_and_calls_give_timms_shapes_and_values(tmp_path, name, kw):
    ref, ours = _pair(tmp_path, name, kw)
    for attr in ("num_features", "embed_dim", "num_prefix_tokens", "head_hidden_size"):
        assert getattr(ours, attr) == getattr(ref, attr), attr
    assert ours.feature_info == ref.feature_info
    assert ours.feature_info[0]["num_chs"] == ref.feature_info[0]["num_chs"]  # a list, indexable as timm's
    head_m, head_t = ours.get_classifier(), ref.get_classifier()
    assert type(head_m) is type(head_t) and getattr(head_m, "weight", torch.ones(1)).shape == getattr(
        head_t, "weight", torch.ones(1)).shape
    x = torch.randn(2, 3, *ours.config.img_size)
    with torch.no_grad():
        for kwargs in ({}, dict(indices=2, norm=True), dict(indices=[0, -1], output_fmt="NLC", stop_early=True),
                       dict(indices=1, return_prefix_tokens=True), dict(intermediates_only=True)):
            mine, theirs = ours.forward_intermediates(x, **kwargs), ref.forward_intermediates(x, **kwargs)
            flat_m = [mine] if torch.is_tensor(mine) else list(mine) if kwargs.get("intermediates_only") else \
                [mine[0]] + [t for m in mine[1] for t in (m if isinstance(m, tuple) else (m,))]
            flat_t = [theirs] if torch.is_tensor(theirs) else list(theirs) if kwargs.get("intermediates_only") else \
                [theirs[0]] + [t for m in theirs[1] for t in (m if isinstance(m, tuple) else (m,))]
            assert len(flat_m) == len(flat_t), kwargs
            for a, b in zip(flat_m, flat_t):
                assert a.shape == b.shape and rel_err(a, b) < 1e-5, kwargs
        dict_m = ours.forward_intermediates(x, indices=2, output_dict=True, return_prefix_tokens=True)
        dict_t = ref.forward_intermediates(x, indices=2, output_dict=True, return_prefix_tokens=True)
        assert dict_m.keys() == dict_t.keys()
        assert rel_err(dict_m["image_features"], dict_t["image_features"]) < 1e-5
    pruned_m, pruned_t = copy.deepcopy(ours), copy.deepcopy(ref)
    assert pruned_m.prune_intermediate_layers([0]) == pruned_t.prune_intermediate_layers([0]) == [0]
    assert len(pruned_m.blocks) == len(pruned_t.blocks) == 1 and pruned_m.config.depth == 1
    with torch.no_grad():
        assert rel_err(pruned_m.forward_features(x), pruned_t.forward_features(x)) < 1e-5
        assert rel_err(pruned_m.forward_intermediates(x)[1][0], pruned_t.forward_intermediates(x)[1][0]) < 1e-5


def test_resolve_model_data_config_returns_the_models_own_preprocessing(tmp_path):
    from timm.data import create_transform, resolve_model_data_config

    ref, ours = _pair(tmp_path, "vit_small_patch16_224", dict(depth=1))
    got = resolve_model_data_config(ours)
    want = ours.pretrained_cfg
    assert got["mean"] == tuple(want["mean"]) and got["std"] == tuple(want["std"])
    assert got["input_size"] == (3, 224, 224) and got["interpolation"] == want["interpolation"]
    assert got["crop_pct"] == pytest.approx(want["crop_pct"])
    hf = vitkit.VisionTransformer(ours.config)  # another ecosystem's preprocessing: mean = std = 0.5, squash
    hf.meta.preprocessing = dataclasses.asdict(vitkit.get_preset("hf"))
    got = resolve_model_data_config(hf)
    assert got["mean"] == (0.5, 0.5, 0.5) and got["crop_mode"] == "squash" and got["crop_pct"] == 1.0
    fresh = vitkit.VisionTransformer(ours.config)  # a freshly built model: the default, marked as one
    assert fresh.pretrained_cfg["default_preprocessing"] is True
    assert resolve_model_data_config(fresh)["mean"] == (0.5, 0.5, 0.5)
    create_transform(**resolve_model_data_config(fresh))  # timm's pipeline builds from it


def test_reset_classifier_as_timm(tmp_path):
    ref, ours = _pair(tmp_path, "vit_small_patch16_224", dict(depth=1, img_size=32))
    ours.reset_classifier(5)
    ref.reset_classifier(5)
    head_m, head_t = ours.get_classifier(), ref.get_classifier()
    assert type(head_m) is type(head_t) and getattr(head_m, "weight", torch.ones(1)).shape == getattr(
        head_t, "weight", torch.ones(1)).shape == (5, 384)
    ours.reset_classifier(0)
    ref.reset_classifier(0)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert ours(x).shape == ref(x).shape == (2, 384) and rel_err(ours(x), ref(x)) < 1e-5
