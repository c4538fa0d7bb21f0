import pytest
import torch

from vitkit import ViTConfig
from vitkit.models import kernel_plan


@pytest.fixture(scope="session", autouse=True)
def _own_kernel_cache(tmp_path_factory):
    """The suite measures into its own cache file, never the user's (and starts from none); so do the processes
    it starts (vitkit train, torchrun ranks, the CLI), through the environment."""
    path = tmp_path_factory.mktemp("kernel-cache") / "kernels.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(kernel_plan.CACHE_ENV, str(path))
        yield


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def tiny_cfg():
    """A ViT small enough for unit tests: 32 px images, 4 px patches, width 64, 2 blocks."""
    return ViTConfig(img_size=32, patch_size=4, width=64, depth=2, num_heads=4, mlp_dim=128, num_classes=10)


@pytest.fixture(scope="session")
def small_trained_vit():
    """A small ViT trained on Fashion-MNIST for about a minute (tests/_small_vit.py), once per session."""
    from vitkit.data import find_idx_dataset
    try:
        find_idx_dataset()
    except FileNotFoundError:
        pytest.skip("Fashion-MNIST not installed (make data)")
    from _small_vit import train_small_vit
    return train_small_vit()


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty measurement file (the default table of plans resolved in the test) and every field auto."""
    monkeypatch.delenv(kernel_plan.ENV, raising=False)
    monkeypatch.setenv(kernel_plan.CACHE_ENV, str(tmp_path / "kernels.json"))
    yield tmp_path / "kernels.json"
