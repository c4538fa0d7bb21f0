"""``vitkit push WEIGHTS REPO_ID``: weights to a Hugging Face Hub repository, as a folder the other libraries
load: timm's (``model.safetensors`` + ``config.json``: ``timm.create_model("hf-hub:REPO_ID", pretrained=True)``)
or transformers' (``save_pretrained``'s files: ``AutoModelForImageClassification.from_pretrained(REPO_ID)``), with
a model card. ``--dry-run DIR`` writes the folder that would be uploaded, and nothing else.

The card has YAML front matter the Hub reads (license, library_name, pipeline_tag, tags, base_model, datasets,
``model-index`` results) and usage for vitkit, timm and transformers. What it states comes from what vitkit
knows of the weights (:class:`Provenance`): a known checkpoint's publisher (its licence, base model and data),
a Hub folder's own card, or the training run that wrote a vitkit folder (its ``results.json`` and
``recipe.yaml``: the data set and the accuracies measured).

The repository is created when it does not exist; the upload is one commit through ``huggingface_hub``
(the ``hub`` extra), with its token (``token=`` or ``HF_TOKEN`` / ``huggingface-cli login``) and its
endpoint (``HF_ENDPOINT``).
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import yaml

from ..errors import InputError, require
from ..utils import PathLike, atomic_path, staged_output
from ..variants import architecture
from .base import Checkpoint
from .load import checkpoint_of, read_weights, save_weights
from .registry import KnownCheckpoint, get_known

LAYOUTS = ("timm", "hf")


def repo_folder(weights: Union[Any, Checkpoint, str, PathLike], repo_id: str, folder: PathLike, *,
                to: str = "timm", license: Optional[str] = None, num_heads: Optional[int] = None,
                offline: Optional[bool] = None) -> Path:
    """Write the repository ``push_to_hub`` uploads (the weights in ``to``'s layout and README.md, the model
    card: :func:`vitkit.checkpoints.card.model_card`) into the new folder ``folder``; returns it."""
    return _write_repo(weights, repo_id, folder, to=to, license=license, num_heads=num_heads, offline=offline)[0]


def _write_repo(weights, repo_id: str, folder: PathLike, *, to: str, license: Optional[str],
                num_heads: Optional[int], offline: Optional[bool] = None) -> Tuple[Path, Checkpoint]:
    if to not in LAYOUTS:
        raise InputError(f"--to {to!r}: the Hub folders are timm's or transformers' ('timm' or 'hf')")
    if "/" not in repo_id:
        raise InputError(f"repository {repo_id!r}: give OWNER/NAME (e.g. acme/vit-small-pets)")
    given = None
    if isinstance(weights, Checkpoint):
        ckpt = weights
    elif hasattr(weights, "state_dict") and hasattr(weights, "config"):
        ckpt = checkpoint_of(weights)
    else:
        given = str(weights)
        ckpt = read_weights(weights, num_heads=num_heads, offline=offline)
    prov = provenance(ckpt, get_known(given or ckpt.source or ""), given)
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise InputError(f"{folder} already exists and is not an empty folder: choose a new one")
    with staged_output(folder) as out:
        out = save_weights(ckpt, out, to)  # refuses what the layout cannot hold, first
        with atomic_path(out / "README.md") as tmp:
            tmp.write_text(model_card(ckpt, repo_id, to, prov, license), encoding="utf-8")
    return folder, ckpt


def push_to_hub(weights: Union[Any, Checkpoint, str, PathLike], repo_id: str, *, to: str = "timm",
                private: bool = False, token: Optional[str] = None, revision: Optional[str] = None,
                message: Optional[str] = None, num_heads: Optional[int] = None, license: Optional[str] = None,
                dry_run: Optional[PathLike] = None) -> str:
    """Upload ``weights`` (a model, a :class:`Checkpoint`, or anything :func:`load_weights` reads) to the Hub
    repository ``repo_id`` in ``to``'s folder layout (``timm`` or ``hf``) with its model card (``license``: a
    Hub licence id; default: the source's where vitkit knows it, else ``unknown``); returns the commit's URL.
    ``dry_run``: write the exact folder that would be uploaded there instead (no network, no token, and
    huggingface_hub need not be installed); returns its path."""
    if dry_run is not None:
        return str(repo_folder(weights, repo_id, dry_run, to=to, license=license, num_heads=num_heads))
    if to not in LAYOUTS:
        raise InputError(f"--to {to!r}: the Hub folders are timm's or transformers' ('timm' or 'hf')")
    if "/" not in repo_id:
        raise InputError(f"repository {repo_id!r}: give OWNER/NAME (e.g. acme/vit-small-pets)")
    require("hub", "huggingface_hub", what="vitkit push")  # an expected failure in one line, not a traceback
    from huggingface_hub import HfApi

    with tempfile.TemporaryDirectory(prefix="vitkit-push-") as tmp:
        folder, ckpt = _write_repo(weights, repo_id, Path(tmp) / "repo", to=to, license=license, num_heads=num_heads)
        api = HfApi(token=token)
        api.create_repo(repo_id, private=private, exist_ok=True)
        info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, revision=revision,
                                 commit_message=message or f"vitkit: {ckpt.describe()}")
    return str(getattr(info, "commit_url", info))


# the licences the publishers of vitkit's known checkpoints state (Hub licence identifiers)
SOURCE_LICENSES = {"torchvision": "bsd-3-clause", "vit_jax": "apache-2.0", "big_vision": "apache-2.0"}
NAME_LICENSES = {"openai/": "mit", "clip": "mit", "dinov2": "apache-2.0", "siglip": "apache-2.0",
                 "deit": "apache-2.0", "google/vit": "apache-2.0", "augreg": "apache-2.0"}
LABEL_DATASETS = {"imagenet1k": "imagenet-1k", "imagenet21k": "imagenet-21k"}
# vitkit's data set specs -> Hub data set ids (folders, shards and tensor files have none)
SPEC_DATASETS = {"fashion-mnist": ("zalando-datasets/fashion_mnist", "Fashion-MNIST"),
                 "fmnist": ("zalando-datasets/fashion_mnist", "Fashion-MNIST"), "mnist": ("ylecun/mnist", "MNIST"),
                 "cifar10": ("uoft-cs/cifar10", "CIFAR-10"), "cifar-10": ("uoft-cs/cifar10", "CIFAR-10"),
                 "cifar100": ("uoft-cs/cifar100", "CIFAR-100"), "cifar-100": ("uoft-cs/cifar100", "CIFAR-100")}


@dataclass
class Provenance:
    """Where the weights come from, as far as vitkit knows: ``license`` (None: unknown), ``base_model`` (a
    Hub repository), ``datasets`` (Hub ids), ``results`` (model-index entries) and ``origin`` (one line)."""

    license: Optional[str] = None
    base_model: Optional[str] = None
    datasets: List[str] = field(default_factory=list)
    results: List[Dict[str, Any]] = field(default_factory=list)
    origin: str = "a vitkit model"


def provenance(ckpt: Checkpoint, entry: Optional[KnownCheckpoint] = None, given: Optional[str] = None) -> Provenance:
    """What the card can state about ``ckpt``: from the known checkpoint ``entry``, the Hub repository the
    name ``given`` names, the source folder's own README.md, or the run that trained it."""
    from .sources import as_repo

    p = Provenance(origin=ckpt.source or "a vitkit model")
    if entry is not None:
        p.license = _known_license(entry)
        p.base_model = entry.hub_repo
        p.datasets = [LABEL_DATASETS[entry.labels]] if entry.labels in LABEL_DATASETS else []
        p.origin = f"{entry.name} ({entry.reference or entry.url})"
    elif given and not Path(given).expanduser().exists() and as_repo(given):
        p.base_model = as_repo(given)[0]
        p.origin = f"the Hub repository {p.base_model}"
    source = Path(ckpt.source) if ckpt.source else None
    if source is not None and source.is_dir():
        front = front_matter(source / "README.md")
        p.license = p.license or front.get("license")
        p.datasets = p.datasets or list(front.get("datasets") or [])
        run = training_run(source)
        if run is not None:
            _from_run(p, run)
    return p


def front_matter(readme: Path) -> Dict[str, Any]:
    """The YAML front matter of a model card (``---`` ... ``---`` at its top), or {} (none, or not readable)."""
    try:
        text = readme.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    if not text.startswith("---"):
        return {}
    head = text[3:].split("\n---", 1)[0]
    try:
        data = yaml.safe_load(head)
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def training_run(folder: Path) -> Optional[Dict[str, Any]]:
    """The run that wrote the vitkit folder ``folder`` (``RUN/model``): ``results`` (RUN/results.json, which
    names the folder) and ``recipe`` (RUN/recipe.yaml); None when the folder is not a run's output."""
    run = folder.resolve().parent
    try:
        results = json.loads((run / "results.json").read_text(encoding="utf-8"))
        recipe = yaml.safe_load((run / "recipe.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError):
        return None
    if not isinstance(results, dict) or not isinstance(recipe, dict) or not results.get("model"):
        return None
    if Path(str(results["model"])).name != folder.resolve().name:
        return None
    return {"results": results, "recipe": recipe}


def _known_license(entry: KnownCheckpoint) -> Optional[str]:
    name = entry.name.lower()
    return next((lic for key, lic in NAME_LICENSES.items() if key in name), SOURCE_LICENSES.get(entry.source))


def _from_run(p: Provenance, run: Dict[str, Any]) -> None:
    """The run's data set, base model (``init.checkpoint``) and accuracies as model-index results."""
    results, recipe = run["results"], run["recipe"]
    spec = str((recipe.get("data") or {}).get("dataset") or "")
    hub_id, pretty = SPEC_DATASETS.get(spec.partition(":")[0].strip().lower(), (None, spec or "training data"))
    if hub_id:
        p.datasets = [hub_id]
    init = (recipe.get("init") or {}).get("checkpoint")
    if init:
        known = get_known(str(init))
        p.base_model = (known.hub_repo if known else None) or p.base_model
        p.license = p.license or (_known_license(known) if known else None)
    p.origin = f"a vitkit training run (recipe {results.get('recipe') or recipe.get('name')}, " \
               f"{results.get('steps')} steps)"
    dataset = {"type": hub_id or spec, "name": pretty}
    for split, prefix in (("test", "test_"), ("validation", None)):
        scores = ({k[len(prefix):]: v for k, v in results.items() if k.startswith(prefix)} if prefix else
                  (results.get("val") or {}).get(results.get("exported_weights") or "", {}))
        metrics = [{"type": "accuracy", "name": f"{name} accuracy", "value": round(float(scores[key]), 6)}
                   for key, name in (("top1", "Top-1"), ("top5", "Top-5")) if isinstance(scores.get(key), (int, float))]
        if metrics:
            p.results.append({"task": {"type": "image-classification", "name": "Image Classification"},
                              "dataset": dict(dataset, split=split), "metrics": metrics})


def card_metadata(ckpt: Checkpoint, repo_id: str, layout: str, prov: Provenance,
                  license: Optional[str] = None) -> Dict[str, Any]:
    """The front matter: what the Hub indexes the repository by."""
    classifier = ckpt.config.num_classes > 0
    meta: Dict[str, Any] = {
        "license": license or prov.license or "unknown",
        "library_name": "timm" if layout == "timm" else "transformers",
        "pipeline_tag": "image-classification" if classifier else "image-feature-extraction",
        "tags": ["vitkit", "vision-transformer", "image-classification" if classifier else "feature-extraction",
                 "timm" if layout == "timm" else "transformers", "safetensors"]}
    if prov.base_model and prov.base_model != repo_id:
        meta["base_model"] = prov.base_model
    if prov.datasets:
        meta["datasets"] = list(prov.datasets)
    if prov.results and classifier:
        meta["model-index"] = [{"name": repo_id.split("/")[-1], "results": prov.results}]
    return meta


def model_card(ckpt: Checkpoint, repo_id: str, layout: str, prov: Optional[Provenance] = None,
               license: Optional[str] = None) -> str:
    """README.md for the repository: the front matter, what the model is, and how each library loads it."""
    prov = prov or provenance(ckpt)
    meta = card_metadata(ckpt, repo_id, layout, prov, license)
    cfg = ckpt.config
    lines = ["---", yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).rstrip(), "---", "",
             f"# {repo_id.split('/')[-1]}", "", f"**{architecture(cfg)}** ({ckpt.describe()}).", "",
             f"Written by vitkit from {prov.origin}."]
    if ckpt.preprocessing:
        from ..data.preprocess import Preset
        lines += ["", f"Preprocessing: {Preset.from_dict(ckpt.preprocessing).describe()}."]
    if ckpt.labels:
        shown = ", ".join(ckpt.labels[:10]) + (f", ... ({len(ckpt.labels)} in all)" if len(ckpt.labels) > 10 else "")
        lines += ["", f"Classes: {shown}."]
    if meta.get("model-index"):
        lines += ["", "## Results", "", "| split | metric | value |", "|---|---|---|"]
        lines += [f"| {r['dataset']['split']} | {m['name']} | {100 * m['value']:.2f}% |"
                  for r in meta["model-index"][0]["results"] for m in r["metrics"]]
    lines += ["", *_usage(repo_id, layout, cfg.num_classes > 0)]
    return "\n".join(lines) + "\n"


def _usage(repo_id: str, layout: str, classifier: bool) -> List[str]:
    auto = "AutoModelForImageClassification" if classifier else "AutoModel"
    vitkit_call = ('preds = vitkit.classify(model, ["image.jpg"])  # top-5 classes, its own preprocessing'
                   if classifier else 'features = model(vitkit.create_transform(model)("image.jpg")[None])  # pooled')
    out = ["## Usage", "", "### vitkit", "", "```python", "import vitkit", "",
           f'model = vitkit.load_weights("{repo_id}")  # pip install "vitkit[hub]"', vitkit_call, "```", "",
           "### timm", ""]
    if layout == "timm":
        out += ["```python", "import timm", "",
                f'model = timm.create_model("hf-hub:{repo_id}", pretrained=True).eval()',
                "config = timm.data.resolve_model_data_config(model)",
                "transform = timm.data.create_transform(**config, is_training=False)", "```"]
    else:
        out += ["This repository holds transformers' files; timm reads timm's layout, which "
                "`vitkit push WEIGHTS OWNER/NAME --to timm` writes."]
    out += ["", "### transformers", "", "```python", f"from transformers import AutoImageProcessor, {auto}", "",
            f'processor = AutoImageProcessor.from_pretrained("{repo_id}")',
            f'model = {auto}.from_pretrained("{repo_id}")', "```"]
    if layout == "timm":
        out += ["", "(transformers loads timm's layout through its TimmWrapper classes, transformers 4.47 or later "
                "with timm installed.)"]
    return out
