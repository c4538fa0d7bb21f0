"""Cross-check against Hugging Face transformers' ViT with random weights (no network).

The weights go through ``save_pretrained`` so the key names are those of the
files people download (transformers 5 renames modules in memory but writes the
classic layout); they are mapped with vitkit's own Hugging Face key map.
"""
import pytest
import torch
from safetensors.torch import load_file

from vitkit import VisionTransformer, ViTConfig
from vitkit.checkpoints.formats import hf as hf_format

transformers = pytest.importorskip("transformers")


def hf_to_vitkit(sd, depth, num_heads=4):
    """vitkit's Hugging Face key map (vitkit.checkpoints.formats.hf), applied to the saved tensors."""
    ck = hf_format.read(dict(sd), num_heads=num_heads, source="hf test")
    assert ck.config.depth == depth
    return ck.state


def hf_config(**kw):
    base = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
                image_size=32, patch_size=4, num_channels=3, hidden_act="gelu", layer_norm_eps=1e-12,
                attn_implementation="eager")
    base.update(kw)
    attn = base.pop("attn_implementation")
    cfg = transformers.ViTConfig(**base)
    cfg._attn_implementation = attn
    return cfg


def ours_from(cfg, **kw):
    return ViTConfig(img_size=cfg.image_size, patch_size=cfg.patch_size, width=cfg.hidden_size,
                     depth=cfg.num_hidden_layers, num_heads=cfg.num_attention_heads, mlp_dim=cfg.intermediate_size,
                     ln_eps=cfg.layer_norm_eps, **kw)


def saved_state(model, tmp_path):
    model.save_pretrained(tmp_path)
    return load_file(str(tmp_path / "model.safetensors"))


def assert_rel_close(a, b, rtol=1e-5):
    err = ((a - b).abs().max() / b.abs().max()).item()
    assert err < rtol, f"max relative error {err:.2e}"


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_vit_model_features_and_pooler(attn, tmp_path):
    torch.manual_seed(0)
    cfg = hf_config(attn_implementation=attn)
    hf = transformers.ViTModel(cfg, add_pooling_layer=True).eval()
    for p in hf.parameters():  # random, non-trivial values everywhere
        torch.nn.init.normal_(p, std=0.1)
    ours = VisionTransformer(ours_from(cfg, num_classes=0, representation_size=64)).eval()
    ours.load_state_dict(hf_to_vitkit(saved_state(hf, tmp_path), cfg.num_hidden_layers))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = hf(pixel_values=x)
        tokens = ours.forward_features(x)
        assert_rel_close(tokens, ref.last_hidden_state)
        # HF's pooler (dense + tanh on token 0) is the paper's pre-logits layer
        assert_rel_close(ours.forward_head(tokens, pre_logits=True), ref.pooler_output)
        _, maps = ours(x, return_attention=True)
        hf_eager = transformers.ViTModel(hf_config(), add_pooling_layer=True).eval()
        hf_eager.load_state_dict(hf.state_dict())
        ref_maps = hf_eager(pixel_values=x, output_attentions=True).attentions
    for a, b in zip(maps, ref_maps):
        assert_rel_close(a, b)


def test_image_classification_logits(tmp_path):
    torch.manual_seed(1)
    cfg = hf_config(num_labels=7, image_size=48, patch_size=8)
    hf = transformers.ViTForImageClassification(cfg).eval()
    for p in hf.parameters():
        torch.nn.init.normal_(p, std=0.1)
    sd = {k.removeprefix("vit."): v for k, v in saved_state(hf, tmp_path).items()}
    mapped = hf_to_vitkit(sd, cfg.num_hidden_layers)
    assert torch.equal(mapped["head.weight"], sd["classifier.weight"])
    ours = VisionTransformer(ours_from(cfg, num_classes=7)).eval()
    ours.load_state_dict(mapped)
    x = torch.randn(3, 3, 48, 48)
    with torch.no_grad():
        assert_rel_close(ours(x), hf(pixel_values=x).logits)


def deit_config(**kw):
    base = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                image_size=32, patch_size=8, num_channels=3, hidden_act="gelu", layer_norm_eps=1e-12, num_labels=5)
    base.update(kw)
    cfg = transformers.DeiTConfig(**base)
    cfg._attn_implementation = "eager"
    return cfg


@pytest.mark.parametrize("kind", ["teacher", "classifier", "model"])
def test_deit_logits_and_features_both_ways(kind, tmp_path):
    """HF's DeiT: with teacher (two heads, logits averaged), DeiTForImageClassification (the class token's
    head only, the distillation token still in the sequence) and DeiTModel; read from a saved folder and
    written back as a folder HF loads with the same outputs."""
    from vitkit.checkpoints import load_weights, save_weights
    torch.manual_seed(2)
    cfg = deit_config()
    cls = {"teacher": transformers.DeiTForImageClassificationWithTeacher,
           "classifier": transformers.DeiTForImageClassification, "model": transformers.DeiTModel}[kind]
    hf = cls(cfg).eval()
    for p in hf.parameters():
        torch.nn.init.normal_(p, std=0.1)
    hf.save_pretrained(tmp_path / "hf")
    ours = load_weights(tmp_path / "hf")
    c = ours.config
    assert c.distill_token and c.seq_len == 2 + 16 and c.distill_head == (kind == "teacher")
    assert c.num_classes == (0 if kind == "model" else 5)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = hf(pixel_values=x)
        if kind == "model":
            assert_rel_close(ours.forward_features(x), ref.last_hidden_state)
            assert_rel_close(ours(x), ref.last_hidden_state[:, 0])  # the class token's features
        else:
            assert_rel_close(ours(x), ref.logits)
        if kind == "teacher":
            from vitkit.train.distill import TwoHeads  # the two heads apart, as distillation trains them
            cls_logits, dist_logits = TwoHeads(ours)(x)
            assert_rel_close(cls_logits, ref.cls_logits)
            assert_rel_close(dist_logits, ref.distillation_logits)
    out = save_weights(ours, tmp_path / "back", "hf")
    saved = __import__("json").loads((out / "config.json").read_text())
    assert saved["model_type"] == "deit" and saved["architectures"] == [cls.__name__]
    back = cls.from_pretrained(out).eval()
    with torch.no_grad():
        new = back(pixel_values=x)
    if kind == "model":
        assert_rel_close(new.last_hidden_state, ref.last_hidden_state)
    else:
        assert_rel_close(new.logits, ref.logits)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_image_classification_training_gradients(attn, tmp_path):
    """Training equivalence: for the same weights, batch and loss, every gradient equals Hugging Face's after
    the same key map as the weights (q/k/v joined; a linear map, so it carries gradients too); float64 (HF's
    eager attention takes its softmax in float32 whatever the dtype, hence the looser bound there)."""
    torch.manual_seed(2)
    cfg = hf_config(num_labels=5, attn_implementation=attn, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    hf = transformers.ViTForImageClassification(cfg).double().train()
    for p in hf.parameters():
        torch.nn.init.normal_(p, std=0.1)
    sd = {k.removeprefix("vit."): v for k, v in saved_state(hf, tmp_path / "w").items()}
    ours = VisionTransformer(ours_from(cfg, num_classes=5)).double().train()
    ours.load_state_dict(hf_to_vitkit(sd, cfg.num_hidden_layers))
    x, y = torch.randn(3, 3, 32, 32, dtype=torch.float64), torch.tensor([0, 3, 4])
    torch.nn.functional.cross_entropy(ours(x), y).backward()
    torch.nn.functional.cross_entropy(hf(pixel_values=x).logits, y).backward()
    with torch.no_grad():  # Hugging Face's gradients, written and mapped as if they were weights
        for p in hf.parameters():
            p.copy_(p.grad)
    grads = hf_to_vitkit({k.removeprefix("vit."): v for k, v in saved_state(hf, tmp_path / "g").items()},
                         cfg.num_hidden_layers)
    mine = dict(ours.named_parameters())
    assert set(grads) == set(mine)
    for name, p in mine.items():
        assert_rel_close(p.grad, grads[name].to(p.grad.dtype), rtol=1e-10 if attn == "sdpa" else 1e-6)
