"""The authors' .npz layouts: files with the released key names and shapes, read, written back byte for byte,
and a numpy re-implementation of the Flax forward pass to check that the key map means what it says."""
import zipfile

import numpy as np
import pytest
import torch

from vitkit.checkpoints import convert, load_weights, read_checkpoint
from vitkit.checkpoints.formats import npz as npz_format

VIT_JAX = ("LayerNorm_0", "MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3")
BIG_VISION = ("LayerNorm_0", "MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0")


def released_arrays(*, width=768, depth=12, heads=12, mlp=3072, patch=16, grid=14, classes=1000,
                    pre_logits=None, names=VIT_JAX, prefix="", posemb_key="Transformer/posembed_input/pos_embedding",
                    class_slot=True, seed=0):
    """Arrays named and shaped as in the released checkpoints (defaults: ViT-B/16 at 224)."""
    rng = np.random.default_rng(seed)

    def r(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    ln1, att, ln2, mlpb = names
    hd = width // heads
    a = {"embedding/kernel": r(patch, patch, 3, width), "embedding/bias": r(width), "cls": r(1, 1, width),
         posemb_key: r(1, grid * grid + (1 if class_slot else 0), width)}
    for i in range(depth):
        b = f"Transformer/encoderblock_{i}/"
        for ln in (ln1, ln2):
            a[f"{b}{ln}/scale"], a[f"{b}{ln}/bias"] = r(width), r(width)
        for n in ("query", "key", "value"):
            a[f"{b}{att}/{n}/kernel"], a[f"{b}{att}/{n}/bias"] = r(width, heads, hd), r(heads, hd)
        a[f"{b}{att}/out/kernel"], a[f"{b}{att}/out/bias"] = r(heads, hd, width), r(width)
        a[f"{b}{mlpb}/Dense_0/kernel"], a[f"{b}{mlpb}/Dense_0/bias"] = r(width, mlp), r(mlp)
        a[f"{b}{mlpb}/Dense_1/kernel"], a[f"{b}{mlpb}/Dense_1/bias"] = r(mlp, width), r(width)
    a["Transformer/encoder_norm/scale"], a["Transformer/encoder_norm/bias"] = r(width), r(width)
    if pre_logits:
        a["pre_logits/kernel"], a["pre_logits/bias"] = r(width, pre_logits), r(pre_logits)
    if classes:
        a["head/kernel"], a["head/bias"] = r(pre_logits or width, classes), r(classes)
    return {prefix + k: v for k, v in a.items()}


def write(path, arrays):
    np.savez(path, **arrays)  # how the released files were written
    return path


def members(path):
    with zipfile.ZipFile(path) as z:
        return {n: z.read(n) for n in z.namelist()}


def assert_byte_identical(a, b):
    ma, mb = members(a), members(b)
    assert sorted(ma) == sorted(mb)
    for name in ma:  # each member is the .npy header + raw data: dtype, shape, order and bytes
        assert ma[name] == mb[name], name


# --- the released layouts: every tensor shaped as in ViT-B/16; one block in the quick runs, all 12 in slow ones
DEPTHS = [1, pytest.param(12, marks=pytest.mark.slow)]


@pytest.mark.parametrize("depth", DEPTHS)
def test_b16_in21k_with_pre_logits_round_trip(tmp_path, depth):
    src = write(tmp_path / "ViT-B_16.npz", released_arrays(depth=depth, classes=21843, pre_logits=768))
    ck = read_checkpoint(src)
    cfg = ck.config
    assert (cfg.width, cfg.depth, cfg.num_heads, cfg.mlp_dim, cfg.patch_size, cfg.img_size) == \
        (768, depth, 12, 3072, (16, 16), (224, 224))
    assert cfg.num_classes == 21843 and cfg.representation_size == 768
    assert cfg.gelu == "tanh" and cfg.ln_eps == 1e-6  # Flax nn.gelu defaults to the tanh form
    assert ck.layout["flavour"] == "vit_jax" and ck.preprocessing["name"] == "authors"
    convert(src, tmp_path / "direct.npz", "npz")
    assert_byte_identical(src, tmp_path / "direct.npz")
    convert(src, tmp_path / "as_vitkit", "vitkit")  # A -> vitkit -> A
    convert(tmp_path / "as_vitkit", tmp_path / "back.npz", "npz")
    assert_byte_identical(src, tmp_path / "back.npz")


@pytest.mark.parametrize("depth", DEPTHS)
def test_b16_fine_tuned_384_no_pre_logits_through_torchvision(tmp_path, depth):
    src = write(tmp_path / "ViT-B_16-384.npz", released_arrays(depth=depth, grid=24))
    ck = read_checkpoint(src)
    assert ck.config.img_size == (384, 384) and ck.config.representation_size is None
    assert ck.labels is not None and len(ck.labels) == 1000  # ImageNet-1k names assumed for 1000 classes
    with pytest.warns(UserWarning, match="tanh GELU"):  # torchvision computes with exact GELU
        convert(src, tmp_path / "tv.pth", "torchvision")  # A -> torchvision -> A
    convert(tmp_path / "tv.pth", tmp_path / "back.npz", "npz")
    assert_byte_identical(src, tmp_path / "back.npz")


@pytest.mark.parametrize("depth", DEPTHS)
def test_big_vision_layout_prefix_and_posemb_without_class_slot(tmp_path, depth):
    arrays = released_arrays(depth=depth, names=BIG_VISION, prefix="params/", posemb_key="pos_embedding",
                             class_slot=False)
    src = write(tmp_path / "bv.npz", arrays)
    ck = read_checkpoint(src)
    assert ck.layout == {"flavour": "big_vision", "prefix": "params/", "posemb_key": "pos_embedding",
                         "posemb_class_slot": False, "source_format": "npz"}
    assert ck.config.img_size == (224, 224) and ck.state["pos_embed"].shape == (1, 197, 768)
    assert torch.count_nonzero(ck.state["pos_embed"][:, 0]) == 0  # the class token gets no position
    convert(src, tmp_path / "back.npz", "npz")
    assert_byte_identical(src, tmp_path / "back.npz")
    with pytest.warns(UserWarning, match="tanh GELU"):
        convert(src, tmp_path / "timm.safetensors", "timm", safetensors=True)  # A -> timm -> A, layout named
    convert(tmp_path / "timm.safetensors", tmp_path / "back2.npz", "npz", flavour="big_vision", prefix="params/")
    assert_byte_identical(src, tmp_path / "back2.npz")


# --- small files: meaning of the key map, optimizer state, errors ---------------------
SMALL = dict(width=32, depth=2, heads=4, mlp=64, patch=4, grid=3, classes=5)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def layer_norm(x, scale, bias, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * scale + bias


def flax_forward(a, images, names, depth, pre_logits, class_slot):
    """The Flax model's forward pass written from its definition, in float64 numpy (NHWC images)."""
    ln1, att, ln2, mlpb = names
    k = a["embedding/kernel"].astype(np.float64)
    p = k.shape[0]
    n, h, w, c = images.shape
    patches = images.reshape(n, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(n, -1, p * p * c)
    x = patches @ k.reshape(-1, k.shape[-1]) + a["embedding/bias"]
    pe = a.get("Transformer/posembed_input/pos_embedding", a.get("pos_embedding"))
    if not class_slot:
        x = x + pe
    x = np.concatenate([np.broadcast_to(a["cls"], (n, 1, x.shape[-1])), x], 1)
    if class_slot:
        x = x + pe
    for i in range(depth):
        b = f"Transformer/encoderblock_{i}/"
        y = layer_norm(x, a[f"{b}{ln1}/scale"], a[f"{b}{ln1}/bias"])
        q, kk, v = (np.einsum("ntd,dhk->nthk", y, a[f"{b}{att}/{m}/kernel"]) + a[f"{b}{att}/{m}/bias"]
                    for m in ("query", "key", "value"))
        logits = np.einsum("nqhk,nthk->nhqt", q, kk) / np.sqrt(q.shape[-1])
        wts = np.exp(logits - logits.max(-1, keepdims=True))
        wts /= wts.sum(-1, keepdims=True)
        o = np.einsum("nhqt,nthk->nqhk", wts, v)
        x = x + np.einsum("nqhk,hkd->nqd", o, a[f"{b}{att}/out/kernel"]) + a[f"{b}{att}/out/bias"]
        y = layer_norm(x, a[f"{b}{ln2}/scale"], a[f"{b}{ln2}/bias"])
        y = gelu_tanh(y @ a[f"{b}{mlpb}/Dense_0/kernel"] + a[f"{b}{mlpb}/Dense_0/bias"])
        x = x + y @ a[f"{b}{mlpb}/Dense_1/kernel"] + a[f"{b}{mlpb}/Dense_1/bias"]
    x = layer_norm(x, a["Transformer/encoder_norm/scale"], a["Transformer/encoder_norm/bias"])[:, 0]
    if pre_logits:
        x = np.tanh(x @ a["pre_logits/kernel"] + a["pre_logits/bias"])
    return x @ a["head/kernel"] + a["head/bias"]


@pytest.mark.parametrize("names,class_slot,pre_logits", [(VIT_JAX, True, 16), (BIG_VISION, False, None)])
def test_logits_match_flax_definition(tmp_path, names, class_slot, pre_logits):
    key = "Transformer/posembed_input/pos_embedding" if class_slot else "pos_embedding"
    a = released_arrays(**SMALL, names=names, posemb_key=key, class_slot=class_slot, pre_logits=pre_logits)
    a = {k: v * np.float32(0.3) for k, v in a.items()}
    model = load_weights(write(tmp_path / "m.npz", a))
    assert model.config.gelu == "tanh" and model.config.representation_size == pre_logits
    imgs = np.random.default_rng(1).standard_normal((2, 12, 12, 3))
    ref = flax_forward({k: v.astype(np.float64) for k, v in a.items()}, imgs, names, 2, pre_logits, class_slot)
    with torch.no_grad():
        out = model(torch.from_numpy(imgs).permute(0, 3, 1, 2).float()).double().numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_optimizer_prefix_and_state_ignored(tmp_path):
    a = released_arrays(**SMALL, prefix="opt/target/")
    a["opt/state/step"] = np.array(10)
    a["opt/state/param_states/embedding/kernel/grad_ema"] = np.zeros((4, 4, 3, 32), np.float32)
    ck = read_checkpoint(write(tmp_path / "train.npz", a))
    assert ck.layout["prefix"] == "opt/target/" and "ignored 2 arrays" in ck.notes[0]
    assert ck.config.depth == 2 and ck.config.num_heads == 4
    plain = read_checkpoint(write(tmp_path / "plain.npz", released_arrays(**SMALL)))  # same arrays, no prefix
    assert ck.config == plain.config and ck.state.keys() == plain.state.keys()
    assert all(torch.equal(ck.state[k], v) for k, v in plain.state.items())


def test_foreign_npz_is_refused_with_names(tmp_path):
    a = released_arrays(**SMALL)
    a["MAPHead_0/probe"] = np.zeros((1, 1, 32), np.float32)  # attention-pooling head: not the paper's model
    del a["Transformer/encoderblock_1/MlpBlock_3/Dense_1/bias"]
    with pytest.raises(ValueError) as err:
        read_checkpoint(write(tmp_path / "hybrid.npz", a))
    msg = str(err.value)
    assert "recognised as the npz layout" in msg and "MAPHead_0/probe" in msg
    assert "Transformer/encoderblock_1/MlpBlock_3/Dense_1/bias" in msg


def test_npz_writer_uses_model_heads(tmp_path):
    a = released_arrays(**SMALL)
    model = load_weights(write(tmp_path / "m.npz", a))
    from vitkit.checkpoints import save_weights
    save_weights(model, tmp_path / "out.npz", "npz")
    back = np.load(tmp_path / "out.npz")
    assert back["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"].shape == (32, 4, 8)
    assert npz_format.find_flavour(list(back.keys())) == "vit_jax"
