"""``vitkit push WEIGHTS REPO_ID``: weights to a Hugging Face Hub repository, as a folder the other libraries
load: timm's (``model.safetensors`` + ``config.json``: ``timm.create_model("hf-hub:REPO_ID", pretrained=True)``)
or transformers' (``save_pretrained``'s files: ``AutoModel.from_pretrained(REPO_ID)``), with a model card.

The repository is created when it does not exist; the upload is one commit through ``huggingface_hub``
(the ``hub`` extra), with its token (``token=`` or ``HF_TOKEN`` / ``huggingface-cli login``) and its
endpoint (``HF_ENDPOINT``).
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Optional, Union

from ..errors import InputError, require
from ..utils import PathLike
from .base import Checkpoint
from .load import checkpoint_of, read_weights, save_weights

LAYOUTS = ("timm", "hf")


def model_card(ckpt: Checkpoint, repo_id: str, layout: str) -> str:
    """A README.md for the repository: what the model is and how each library loads it."""
    cfg = ckpt.config
    library = "timm" if layout == "timm" else "transformers"
    task = "image-classification" if cfg.num_classes else "image-feature-extraction"
    load = (f'timm.create_model("hf-hub:{repo_id}", pretrained=True)' if layout == "timm"
            else f'transformers.AutoModel.from_pretrained("{repo_id}")')
    return "\n".join([
        "---", f"library_name: {library}", f"pipeline_tag: {task}", "tags:", "- vitkit", "- vision-transformer", "---",
        "", f"# {repo_id}", "", f"{ckpt.describe()}.", "",
        f"Written by vitkit from {ckpt.source or 'a vitkit model'}. Load it with `{load}`, or with vitkit:",
        f'`vitkit.load_weights("{repo_id}")`.', ""])


def push_to_hub(weights: Union[Any, Checkpoint, str, PathLike], repo_id: str, *, to: str = "timm",
                private: bool = False, token: Optional[str] = None, revision: Optional[str] = None,
                message: Optional[str] = None, num_heads: Optional[int] = None) -> str:
    """Upload ``weights`` (a model, a :class:`Checkpoint`, or anything :func:`load_weights` reads) to the Hub
    repository ``repo_id`` in ``to``'s folder layout (``timm`` or ``hf``); returns the commit's URL."""
    if to not in LAYOUTS:
        raise InputError(f"--to {to!r}: the Hub folders are timm's or transformers' ('timm' or 'hf')")
    if "/" not in repo_id:
        raise InputError(f"repository {repo_id!r}: give OWNER/NAME (e.g. acme/vit-small-pets)")
    require("hub", "huggingface_hub", what="vitkit push")  # an expected failure in one line, not a traceback
    from huggingface_hub import HfApi

    if isinstance(weights, Checkpoint):
        ckpt = weights
    elif hasattr(weights, "state_dict") and hasattr(weights, "config"):
        ckpt = checkpoint_of(weights)
    else:
        ckpt = read_weights(weights, num_heads=num_heads)
    with tempfile.TemporaryDirectory(prefix="vitkit-push-") as tmp:
        folder = save_weights(ckpt, Path(tmp) / "repo", to)  # refuses what the layout cannot hold, first
        (folder / "README.md").write_text(model_card(ckpt, repo_id, to))
        api = HfApi(token=token)
        api.create_repo(repo_id, private=private, exist_ok=True)
        info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, revision=revision,
                                 commit_message=message or f"vitkit: {ckpt.describe()}")
    return str(getattr(info, "commit_url", info))
