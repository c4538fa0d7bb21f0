"""The small-image ResNet of the model factory (the convolutional teacher of fmnist-record): a 3x3 stride-1
root without max-pool and ResNet-18's basic units, as config fields of the one VisionTransformer class."""
import pytest
import torch

import vitkit
from _cost import assert_cost_matches_flop_counter
from _weights import randomize
from vitkit import ViTConfig
from vitkit.checkpoints.formats.hybrid import backbone_fields
from vitkit.models.resnet import BasicUnit, ResidualUnit, ResNet

RESNET18_28PX = dict(img_size=28, in_chans=1, num_classes=10, backbone="resnet", backbone_stem="3x3",
                     backbone_unit="basic", backbone_layers=(2, 2, 2, 2), backbone_width=32, patch_size=1,
                     width=256, depth=0, num_heads=4, mlp_dim=256, posemb="none", pool="gap", class_token=False)


def test_resnet18_shape_for_28px_images():
    cfg = ViTConfig(**RESNET18_28PX)
    trunk = ResNet(1, (2, 2, 2, 2), 32, stem="3x3", unit="basic")
    x = torch.randn(2, 1, 28, 28)
    assert trunk.forward_root(x).shape == (2, 32, 28, 28)  # no stride, no max-pool: the first stage sees 28 px
    sizes = []
    h = trunk.forward_root(x)
    for stage in trunk.stages:
        h = stage(h)
        sizes.append(tuple(h.shape[1:]))
    assert sizes == [(32, 28, 28), (64, 14, 14), (128, 7, 7), (256, 4, 4)]
    assert trunk.stride == cfg.feature_stride == 8 and cfg.grid_size == (4, 4)
    units = [m for m in trunk.modules() if isinstance(m, (BasicUnit, ResidualUnit))]
    assert len(units) == 8 and all(isinstance(u, BasicUnit) for u in units)
    # ResNet-18's convolutions at width 64 (the 3x3 root instead of the 7x7): 16 3x3 convolutions in the units
    # and three 1x1 projections; torchvision's resnet18 has 11,166,912 convolution weights with its 7x7 root
    wide = ResNet(3, (2, 2, 2, 2), 64, stem="3x3", unit="basic")
    conv = sum(m.weight.numel() for m in wide.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv == 11_166_912 - 3 * 49 * 64 + 3 * 9 * 64


def test_basic_units_start_as_the_identity_and_train():
    """The trunk starts the last GroupNorm of each unit at zero (as BiT's units): a unit without projection
    passes its input through the final ReLU; gradients reach the root."""
    unit = ResNet(1, (2,), 32, stem="3x3", unit="basic").stages[0][1]
    x = torch.randn(2, 32, 8, 8)
    assert unit.conv_proj is None and torch.equal(unit(x), torch.relu(x))
    torch.nn.init.ones_(unit.gn2.weight)
    assert not torch.allclose(unit(x), torch.relu(x), atol=1e-2)
    model = vitkit.VisionTransformer(ViTConfig(**RESNET18_28PX))
    torch.nn.init.normal_(model.head.weight, std=0.1)
    model(torch.randn(4, 1, 28, 28)).square().sum().backward()
    assert model.patch_embed.backbone.conv_root.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("fields", [RESNET18_28PX, dict(RESNET18_28PX, backbone_layers=(1, 1), img_size=(20, 12),
                                                        backbone_width=64, depth=1, pool="token", class_token=True,
                                                        posemb="learn")])
def test_cost_matches_flop_counter_and_parameters(fields):
    assert_cost_matches_flop_counter(ViTConfig(**fields))


def test_round_trip_and_fields_read_from_the_weights(tmp_path):
    from vitkit.checkpoints import load_model, save_model, save_weights

    cfg = ViTConfig(**RESNET18_28PX)
    model = vitkit.VisionTransformer(cfg).eval()
    randomize(model)  # the zero-initialised last norms and head would hide the units
    save_model(model, tmp_path / "m")
    again = load_model(tmp_path / "m").eval()
    assert again.config == cfg
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        want = model(x)
        assert want.std() > 1e-3 and torch.equal(want, again(x))
    fields = backbone_fields(model.state_dict())  # a bare state dict says which root and unit it has
    assert (fields["backbone_stem"], fields["backbone_unit"], fields["backbone_layers"]) == ("3x3", "basic",
                                                                                             (2, 2, 2, 2))
    bit = vitkit.VisionTransformer(ViTConfig(img_size=32, backbone="resnet", backbone_layers=(1,), backbone_width=32,
                                             patch_size=1, width=64, depth=1, num_heads=2, mlp_dim=64))
    assert {k: backbone_fields(bit.state_dict())[k] for k in ("backbone_stem", "backbone_unit")} == \
        {"backbone_stem": "bit", "backbone_unit": "bottleneck"}
    with pytest.raises(ValueError, match="BiT ResNets only"):  # timm's layout has no basic units here
        save_weights(model, tmp_path / "t.pth", "timm")


def test_unknown_root_or_unit_is_refused():
    with pytest.raises(ValueError, match="backbone_stem='5x5' is not one of bit, 3x3"):
        ViTConfig(**dict(RESNET18_28PX, backbone_stem="5x5"))
    with pytest.raises(ValueError, match="backbone_unit='basics' is not one of bottleneck, basic; did you mean"):
        ViTConfig(**dict(RESNET18_28PX, backbone_unit="basics"))
