"""torch.hub entry points: ``torch.hub.load("OWNER/vitkit", "vit_b_16", pretrained=True)``, or from a checkout
``torch.hub.load(PATH, "vit_base_patch16_224", source="local")``.

One entry point per model name vitkit knows that is a Python name: the paper's models in torchvision's and
timm's spelling (``vit_b_16``, ``vit_base_patch16_224``, ``vit_base_patch16_384``, the hybrids
``vit_base_r50_s16_224``), the descendants (DeiT III, DINOv2, CLIP and SigLIP towers) and the models of the
published weights (``deit_tiny_distilled_patch16_224``). Each is :func:`vitkit.create_model` under that
name: ``pretrained=False`` builds the model (no network), ``pretrained=True`` loads the weights published for
the name through vitkit's own loader (downloads checked against the published digest, cached, loaded without
executing code; ``vitkit weights`` lists them). Further keyword arguments are ``create_model``'s:
config fields (``num_classes=10``, ``img_size=384``), ``weights=`` (any file, known name, Hub id or URL),
``offline=``, ``cache_dir=``.
"""
import sys
from pathlib import Path

_SRC = Path(__file__).resolve().parent / "src"
if (_SRC / "vitkit").is_dir() and str(_SRC) not in sys.path:  # this checkout's vitkit, not another installed one
    sys.path.insert(0, str(_SRC))

import vitkit  # noqa: E402  (after the path above)
from vitkit.checkpoints.registry import KNOWN  # noqa: E402
from vitkit.variants import HYBRID_MODELS, PAPER_MODELS  # noqa: E402

dependencies = ["torch", "numpy", "PIL", "safetensors", "tqdm", "yaml"]

_LONG = {"Ti": "tiny", "S": "small", "B": "base", "L": "large", "H": "huge"}


def _names():
    """Every Python-name spelling of a model vitkit builds, once each, in a stable order."""
    names = []
    for model in PAPER_MODELS:  # B/16 -> vit_b_16, vit_base_patch16_224, vit_base_patch16_384
        size, patch = model.split("/")
        names += [f"vit_{size.lower()}_{patch}"] if size in ("B", "L", "H") else []
        names += [f"vit_{_LONG[size]}_patch{patch}_{res}" for res in (224, 384) if res % int(patch) == 0]
    for model in HYBRID_MODELS:  # R50+B/16 -> vit_base_r50_s16_224
        resnet, vit = model.split("+")
        size, stride = vit.split("/")
        names += [f"vit_{_LONG[size]}_{resnet.lower()}_s{stride}_{res}" for res in (224, 384)]
    names += [e.model for e in KNOWN.values()]
    names += vitkit.list_models()
    return list(dict.fromkeys(n for n in names if n.isidentifier()))


def _entry(name):
    def build(pretrained=False, **kwargs):
        return vitkit.create_model(name, pretrained=pretrained, **kwargs)

    build.__name__ = build.__qualname__ = name
    build.__doc__ = (f"vitkit.create_model({name!r}, pretrained=...): the model of that name; "
                     f"pretrained=True loads the weights published for it (vitkit weights lists them). Keyword "
                     f"arguments: config fields (num_classes=, img_size=, ...), weights=, offline=, cache_dir=.")
    return build


for _name in _names():
    globals()[_name] = _entry(_name)
del _name
