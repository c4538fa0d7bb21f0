"""Evaluation of frozen models: the paper's few-shot linear probe (Section 4.1) and its features.

- :func:`fewshot_evaluate` / :func:`linear_probe` / :class:`RidgeSolver`: closed-form
  regularised least squares onto {-1, 1}^K targets, one eigendecomposition per task.
- :func:`extract_features` / :func:`cached_features`: batched frozen features, cached on disk.
"""
from .features import (
                       REPRESENTATIONS,
                       FeatureCache,
                       cached_features,
                       extract_features,
                       fingerprint_array,
                       fingerprint_model,
                       prepare_images,
                       represent,
)
from .fewshot import (
                       DEFAULT_L2_GRID,
                       DEFAULT_SHOTS,
                       RidgeSolver,
                       ShotResult,
                       fewshot_evaluate,
                       linear_probe,
                       sample_shots,
)

__all__ = ["DEFAULT_L2_GRID", "DEFAULT_SHOTS", "REPRESENTATIONS", "FeatureCache", "RidgeSolver", "ShotResult",
           "cached_features", "extract_features", "fewshot_evaluate", "fingerprint_array", "fingerprint_model",
           "linear_probe", "prepare_images", "represent", "sample_shots"]
