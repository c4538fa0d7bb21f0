"""Data: datasets (IDX, CIFAR, image folders, tar shards, tensors, any torch / Hugging Face dataset), splits and
loading, batched augmentation,
preprocessing presets."""
from .augment import AugmentConfig, BatchAugment, EvalTransform, Normalize
from .datasets import cifar, fashion_mnist, image_folder, mnist, open_dataset, tensor_file
from .external import ExternalImages, from_dataset
from .fetch import fetch_fashion_mnist
from .idx import FASHION_MNIST_CLASSES, data_home, find_idx_dataset, load_fashion_mnist, load_idx_split, read_idx
from .images import FileImages, TensorImages
from .loader import EpochSampler, Loader, split_indices
from .shards import tar_shards, write_shards

__all__ = ["AugmentConfig", "BatchAugment", "EpochSampler", "EvalTransform", "ExternalImages", "FASHION_MNIST_CLASSES",
           "FileImages", "data_home", "fetch_fashion_mnist", "from_dataset",
           "Loader", "Normalize", "TensorImages", "cifar", "fashion_mnist", "find_idx_dataset", "image_folder",
           "load_fashion_mnist", "load_idx_split", "mnist", "open_dataset", "read_idx", "split_indices",
           "tar_shards", "tensor_file", "write_shards"]
