"""Looking inside a ViT with the paper's instruments (Section 4.5; Figures 6, 7, 11, 14).

- :func:`rollout_maps` / :func:`attention_rollout`: attention rollout (Abnar & Zuidema 2020).
- :func:`mean_attention_distance` / :func:`attention_distance`: how far each head attends, in pixels.
- :func:`posemb_similarity`: cosine similarity between the patches' position embeddings.
- :func:`embedding_filters`: principal components of the patch-embedding filters.
- :func:`analyze`: all of them for a model and some images, written as PNG + JSON.

The functions return tensors; drawing (``vitkit.analysis.plots``) needs matplotlib
(``pip install 'vitkit[plots]'``).
"""
from .distance import attention_distance, mean_attention_distance, patch_distances
from .filters import embedding_filters
from .posemb_similarity import cosine_similarity_grid, near_far_similarity, posemb_similarity, similarity_by_distance
from .report import analyze, load_images
from .rollout import (
                      HEAD_FUSIONS,
                      READOUTS,
                      attention_rollout,
                      fuse_heads,
                      normalize_maps,
                      readout_of,
                      rollout_maps,
                      rollout_to_grid,
)

__all__ = ["HEAD_FUSIONS", "analyze", "attention_distance", "attention_rollout", "cosine_similarity_grid",
           "embedding_filters", "fuse_heads", "load_images", "mean_attention_distance", "near_far_similarity",
           "normalize_maps", "patch_distances", "posemb_similarity", "READOUTS", "readout_of", "rollout_maps",
           "rollout_to_grid",
           "similarity_by_distance"]
