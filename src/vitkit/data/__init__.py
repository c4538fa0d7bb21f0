"""Data: datasets, preprocessing presets and augmentation."""
from .idx import FASHION_MNIST_CLASSES, find_idx_dataset, load_fashion_mnist, load_idx_split, read_idx

__all__ = ["FASHION_MNIST_CLASSES", "find_idx_dataset", "load_fashion_mnist", "load_idx_split", "read_idx"]
