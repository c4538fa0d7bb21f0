"""The reference program's photo demo with the real weights: `vitkit predict chelsea.png coffee.png -w
torchvision/vit_b_16` gives the published top-1 (Egyptian cat 66.07 %, espresso 90.31 %) with torchvision's
own preprocessing (shorter side 256, centre crop 224, ImageNet mean/std).

Runs when torchvision's file (vit_b_16-c867db91.pth, 330 MB) is in torch.hub's cache, where torchvision,
timm or `vitkit weights --download torchvision/vit_b_16` put it; otherwise it skips and says so. It never
downloads.
"""
import json

import pytest
from PIL import Image

from vitkit.checkpoints import WeightsUnavailable, resolve_weights
from vitkit.cli import main

skimage_data = pytest.importorskip("skimage.data")
PUBLISHED = {"chelsea.png": ("Egyptian cat", 66.07), "coffee.png": ("espresso", 90.31)}


def test_published_demo_numbers(tmp_path, capsys):
    try:
        resolve_weights("torchvision/vit_b_16", offline=True)
    except WeightsUnavailable as err:
        pytest.skip(f"torchvision/vit_b_16 weights are not in the cache, so the published numbers are not "
                    f"checked ({err}); run 'vitkit weights --download torchvision/vit_b_16' once online")
    Image.fromarray(skimage_data.chelsea()).save(tmp_path / "chelsea.png")
    Image.fromarray(skimage_data.coffee()).save(tmp_path / "coffee.png")
    files = [str(tmp_path / name) for name in PUBLISHED]
    assert main(["predict", *files, "-w", "torchvision/vit_b_16", "--offline", "--check-hash", "--json",
                 "--no-progress"]) == 0
    for line in capsys.readouterr().out.strip().splitlines():
        pred = json.loads(line)
        label, pct = PUBLISHED[pred["path"].rsplit("/", 1)[-1]]
        top = pred["top"][0]
        assert top["label"] == label and round(100 * top["prob"], 2) == pct, pred
