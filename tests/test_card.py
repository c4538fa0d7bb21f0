"""The model card ``vitkit push`` writes (read from its ``--dry-run`` folder): the Hub's front matter (license,
library_name, pipeline_tag, tags, base_model, datasets, model-index from a training run) and the usage of each
library. The upload itself, and that it sends exactly the dry run's files: tests/test_hub.py."""
import json

import pytest
import torch
import yaml

import vitkit
from vitkit.checkpoints import KNOWN, save_model, save_weights
from vitkit.checkpoints.base import Checkpoint
from vitkit.checkpoints.push import card_metadata, front_matter, provenance
from vitkit.cli import main
from vitkit.data.preprocess import get_preset


def _card(folder):
    text = (folder / "README.md").read_text(encoding="utf-8")
    return front_matter(folder / "README.md"), text


@pytest.fixture
def run(tmp_path):
    """A training run's folder: RUN/model, RUN/results.json (which names it), RUN/recipe.yaml."""
    torch.manual_seed(0)
    model = vitkit.create_model("Ti/16", img_size=32, patch_size=4, depth=1, num_classes=3)
    out = tmp_path / "run"
    save_model(model, out / "model", labels=["shirt", "boot", "bag"], preprocessing=get_preset("hf", 32))
    (out / "results.json").write_text(json.dumps({
        "recipe": "fmnist-demo", "steps": 120, "model": str(out / "model"), "test_top1": 0.8765, "test_top5": 0.9912,
        "exported_weights": "ema", "val": {"ema": {"top1": 0.85, "top5": 0.98, "loss": 0.4},
                                           "raw": {"top1": 0.5, "top5": 0.6, "loss": 1.0}}}))
    (out / "recipe.yaml").write_text(yaml.safe_dump({"name": "fmnist-demo", "data": {"dataset": "fashion-mnist"},
                                                     "init": {"checkpoint": None}}))
    return out


def test_card_of_a_training_run(run, tmp_path, capsys):
    assert main(["push", str(run / "model"), "acme/fmnist-vit", "--dry-run", str(tmp_path / "dry")]) == 0
    assert "nothing was uploaded" in capsys.readouterr().out
    meta, text = _card(tmp_path / "dry")
    assert meta["license"] == "unknown"  # vitkit cannot know the licence of weights someone trained
    assert meta["library_name"] == "timm" and meta["pipeline_tag"] == "image-classification"
    assert {"vitkit", "vision-transformer", "image-classification", "timm"} <= set(meta["tags"])
    assert meta["datasets"] == ["zalando-datasets/fashion_mnist"] and "base_model" not in meta
    (entry,) = meta["model-index"]
    assert entry["name"] == "fmnist-vit"
    got = {(r["dataset"]["split"], m["name"]): m["value"] for r in entry["results"] for m in r["metrics"]}
    # the test numbers, and the validation numbers of the exported (EMA) weights, not the raw ones
    assert got == {("test", "Top-1 accuracy"): 0.8765, ("test", "Top-5 accuracy"): 0.9912,
                   ("validation", "Top-1 accuracy"): 0.85, ("validation", "Top-5 accuracy"): 0.98}
    assert all(r["task"]["type"] == "image-classification" and r["dataset"]["type"] == meta["datasets"][0]
               for r in entry["results"])
    assert "| test | Top-1 accuracy | 87.65% |" in text and "recipe fmnist-demo, 120 steps" in text
    for section in ("### vitkit", "### timm", "### transformers"):
        assert section in text
    assert 'vitkit.load_weights("acme/fmnist-vit")' in text
    assert 'timm.create_model("hf-hub:acme/fmnist-vit", pretrained=True)' in text
    assert 'AutoModelForImageClassification.from_pretrained("acme/fmnist-vit")' in text and "AutoModel." not in text
    assert "Classes: shirt, boot, bag." in text and "resize to 32x32 bilinear" in text
    assert set(p.name for p in (tmp_path / "dry").iterdir()) == {"README.md", "config.json", "model.safetensors"}
    # --license wins; the folder must be new (or empty)
    assert main(["push", str(run / "model"), "acme/fmnist-vit", "--to", "hf", "--license", "apache-2.0",
                 "--dry-run", str(tmp_path / "dry-hf")]) == 0
    meta, text = _card(tmp_path / "dry-hf")
    assert meta["license"] == "apache-2.0" and meta["library_name"] == "transformers"
    assert "timm reads timm's layout" in text  # said, not a snippet that would fail on transformers' files
    capsys.readouterr()
    assert main(["push", str(run / "model"), "acme/fmnist-vit", "--dry-run", str(tmp_path / "dry-hf")]) != 0
    assert "dry-hf already exists and is not an empty folder" in capsys.readouterr().err


def test_card_of_a_feature_extractor_and_a_hub_folder(tmp_path):
    """No classifier: image-feature-extraction and AutoModel; a Hub folder's own card gives licence and data."""
    torch.manual_seed(0)
    model = vitkit.create_model("Ti/16", img_size=32, patch_size=4, depth=1, num_classes=0)
    src = save_weights(model, tmp_path / "src", "hf")
    (src / "README.md").write_text("---\nlicense: mit\ndatasets:\n- acme/photos\n---\n# a model\n")
    assert main(["push", str(src), "acme/feats", "--to", "hf", "--dry-run", str(tmp_path / "dry")]) == 0
    meta, text = _card(tmp_path / "dry")
    assert meta["pipeline_tag"] == "image-feature-extraction" and "model-index" not in meta
    assert meta["license"] == "mit" and meta["datasets"] == ["acme/photos"]
    assert 'AutoModel.from_pretrained("acme/feats")' in text and "AutoModelForImageClassification" not in text


@pytest.mark.parametrize("name, license, base, data", [
    ("torchvision/vit_b_16", "bsd-3-clause", None, ["imagenet-1k"]),
    ("vit_jax/ViT-B_16-i21k", "apache-2.0", None, ["imagenet-21k"]),
    ("hf/google/vit-base-patch16-224", "apache-2.0", "google/vit-base-patch16-224", ["imagenet-1k"]),
    ("timm/vit_base_patch16_clip_224.openai", "mit", "timm/vit_base_patch16_clip_224.openai", []),
])
def test_known_sources_give_licence_base_model_and_data(name, license, base, data):
    entry = KNOWN[name]
    cfg = vitkit.ViTConfig(img_size=32, patch_size=4, width=64, depth=1, num_heads=2, mlp_dim=128, num_classes=5)
    ckpt = Checkpoint({}, cfg, "vitkit", source="/nowhere/weights.pth")
    meta = card_metadata(ckpt, "acme/x", "timm", provenance(ckpt, entry))
    assert meta["license"] == license and meta.get("base_model") == base and meta.get("datasets", []) == data
