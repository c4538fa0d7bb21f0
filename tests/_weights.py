"""Random weights for comparison tests, importable without pytest (tests/extras_smoke.py runs in extras
environments that lack it, through tests/_serve.py)."""
import torch


def randomize(module, std=0.1):
    """Every parameter drawn from N(0, std): the paper's zero head, zero biases and unit LayerNorms would hide
    mistakes in a comparison. Returns the module, in the mode it was in."""
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(std=std)
    return module


def randomize_head(model):
    """The paper's zero head blocks gradients to the backbone; tests that need them give it N(0, 0.02) weights.
    Returns the model."""
    randomize(model.head, std=0.02)
    return model


def perturb(module, std):
    """Every parameter moved by N(0, std) noise around its initial value (LayerNorm scales stay near 1)."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p), alpha=std)
    return module
