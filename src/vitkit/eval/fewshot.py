"""Few-shot linear evaluation (Section 4.1): closed-form regularised least squares on frozen features.

For each task, the k training shots per class are standardised with their own
mean and standard deviation, a constant bias feature is appended, and the
{-1, 1}^K one-vs-rest targets are fitted by ridge regression. One
eigendecomposition per task serves every L2 strength of the sweep:

* n >= d (more shots than features): X^T X = Q diag(e) Q^T and
  W(l2) = Q diag(1 / (e + l2)) Q^T X^T Y;
* n <  d (fewer shots than features): X X^T = Q diag(e) Q^T and
  W(l2) = X^T Q diag(1 / (e + l2)) Q^T Y.

Both are the same ridge solution (X^T X + l2 I)^-1 X^T Y. At l2 = 0 directions
with a zero eigenvalue are dropped, which gives the minimum-norm least-squares
solution that ``numpy.linalg.lstsq`` returns. The L2 strength is chosen on a
validation set drawn from the training pool, disjoint from the shots, never on
the test set.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError, InputError

DEFAULT_SHOTS = (1, 5, 10, 25)
DEFAULT_L2_GRID = tuple(2.0 ** i for i in range(-10, 20))  # the sweep big_vision uses
BIAS_VALUE = 100.0  # a large constant feature, so the bias is (almost) not regularised
STD_EPS = 1e-5


class RidgeSolver:
    """Regularised least squares onto {-1, 1}^K targets, for many L2 strengths from one eigendecomposition.

    ``branch``: "auto" decomposes the smaller of the d x d Gram and the n x n
    kernel matrix; "gram" or "kernel" force one (both give the same weights).

    >>> rng = np.random.default_rng(0)
    >>> x, y = rng.normal(size=(40, 5)), rng.integers(0, 3, 40)
    >>> solver = RidgeSolver(x, y, num_classes=3)
    >>> solver.weights(1.0).shape  # 5 standardised features + the bias feature, 3 classes
    (6, 3)
    """

    def __init__(self, features: np.ndarray, labels: np.ndarray, num_classes: Optional[int] = None,
                 bias_value: float = BIAS_VALUE, branch: str = "auto"):
        x = np.asarray(features, dtype=np.float64)
        y = np.asarray(labels)
        if x.ndim != 2:
            raise InputError(f"features must be a 2-D array [samples, features], got shape {x.shape}")
        if y.shape != (x.shape[0],):
            raise InputError(f"labels must be a 1-D array of {x.shape[0]} class ids, got shape {y.shape}")
        if x.shape[0] == 0:
            raise InputError("no training samples given")
        if not np.all(np.isfinite(x)):
            raise InputError("features contain NaN or Inf: check the model and the input images")
        if not np.issubdtype(y.dtype, np.integer) or y.min() < 0:
            raise InputError("labels must be non-negative integer class ids")
        k = int(num_classes) if num_classes is not None else int(y.max()) + 1
        if y.max() >= k:
            raise InputError(f"label {int(y.max())} is out of range for {k} classes")
        self.num_classes = k
        self.bias_value = float(bias_value)
        self.mean = x.mean(axis=0, keepdims=True)
        self.std = x.std(axis=0, keepdims=True) + STD_EPS
        xa = self.design(x)
        targets = 2.0 * np.eye(k)[y] - 1.0
        n, d = xa.shape
        if branch not in ("auto", "gram", "kernel"):
            raise ConfigError(f"branch must be 'auto', 'gram' or 'kernel', got {branch!r}")
        if branch == "gram" or (branch == "auto" and n >= d):  # the d x d Gram matrix
            eigs, q = np.linalg.eigh(xa.T @ xa)
            self.lhs, self.rhs = q, q.T @ (xa.T @ targets)
            self.branch = "gram"
        else:  # the n x n kernel matrix
            eigs, q = np.linalg.eigh(xa @ xa.T)
            self.lhs, self.rhs = xa.T @ q, q.T @ targets
            self.branch = "kernel"
        self.eigs = np.clip(eigs, 0.0, None)
        # eigenvalues this small are numerically zero (the rule lstsq uses for its cut-off)
        self.cutoff = max(self.eigs.max(initial=0.0), 1.0) * max(n, d) * np.finfo(np.float64).eps

    def design(self, features: np.ndarray) -> np.ndarray:
        """Standardise with the training statistics and append the bias feature: [n, d + 1]."""
        x = (np.asarray(features, dtype=np.float64) - self.mean) / self.std
        return np.concatenate([x, np.full((x.shape[0], 1), self.bias_value)], axis=1)

    def _inverse(self, l2: float) -> np.ndarray:
        if l2 < 0:
            raise InputError(f"L2 strength must be >= 0, got {l2}")
        shifted = self.eigs + l2
        keep = shifted > self.cutoff
        return np.where(keep, 1.0 / np.where(keep, shifted, 1.0), 0.0)

    def weights(self, l2: float) -> np.ndarray:
        """The ridge weights [d + 1, K] (last row: bias) for one L2 strength."""
        return self.lhs @ (self._inverse(l2)[:, None] * self.rhs)

    def scores(self, features: np.ndarray, l2s: Sequence[float]) -> np.ndarray:
        """Class scores [len(l2s), n, K] of new samples, for every L2 strength."""
        proj = self.design(features) @ self.lhs  # computed once, reused for every l2
        return np.stack([proj @ (self._inverse(l2)[:, None] * self.rhs) for l2 in l2s])

    def accuracy(self, features: np.ndarray, labels: np.ndarray, l2s: Sequence[float]) -> np.ndarray:
        """Top-1 accuracy [len(l2s)] on new samples, for every L2 strength."""
        labels = np.asarray(labels)
        if len(labels) == 0:
            raise InputError("no evaluation samples given")
        proj = self.design(features) @ self.lhs  # one [n, K] score matrix at a time: large test sets fit
        return np.array([((proj @ (self._inverse(l2)[:, None] * self.rhs)).argmax(axis=-1) == labels).mean()
                         for l2 in l2s])


def sample_shots(labels: np.ndarray, shots: int, seed: int, classes: Optional[Sequence[int]] = None,
                 val_per_class: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """(shot indices, validation indices): ``shots`` and ``val_per_class`` examples of every class.

    Each class's examples are put in a random order fixed by ``seed``; the
    first ``val_per_class`` are the validation examples and the next ``shots``
    the training shots. So the k-shot sets of one seed are nested (the 1-shot
    example is among the 5 shots) and never overlap the validation examples.
    """
    labels = np.asarray(labels)
    if shots < 1 or val_per_class < 0:
        raise InputError(f"shots must be >= 1 and val_per_class >= 0, got {shots} and {val_per_class}")
    rng = np.random.default_rng(seed)
    classes = np.unique(labels) if classes is None else classes
    picked, val = [], []
    for c in classes:
        pool = rng.permutation(np.flatnonzero(labels == c))
        if len(pool) < val_per_class + shots:
            raise InputError(f"class {c} has only {len(pool)} training examples, fewer than the {shots} shots "
                             f"plus {val_per_class} validation examples asked for: use fewer")
        val.append(pool[:val_per_class])
        picked.append(pool[val_per_class:val_per_class + shots])
    return np.sort(np.concatenate(picked)), np.sort(np.concatenate(val)).astype(np.int64)


def needed_indices(labels: np.ndarray, shots: Sequence[int], seeds: Sequence[int], val_per_class: int) -> np.ndarray:
    """Every training index some task of the sweep uses (features are needed for these only)."""
    used = [np.concatenate(sample_shots(labels, max(shots), s, val_per_class=val_per_class)) for s in seeds]
    return np.unique(np.concatenate(used))


@dataclass
class ShotResult:
    """Accuracy of one k over several seeds at the L2 strength chosen on validation data."""

    shots: int
    l2: float
    accuracies: List[float]  # test accuracy per seed
    val_accuracy: float  # mean validation accuracy at the chosen l2
    per_l2: List[Dict[str, float]]  # the whole sweep: l2, mean validation and mean test accuracy

    @property
    def mean(self) -> float:
        return float(np.mean(self.accuracies))

    @property
    def std(self) -> float:
        return float(np.std(self.accuracies, ddof=1)) if len(self.accuracies) > 1 else 0.0

    def to_dict(self) -> Dict[str, object]:
        """The result as plain JSON values (fewshot.json)."""
        return {"shots": self.shots, "mean": self.mean, "std": self.std, "min": float(min(self.accuracies)),
                "max": float(max(self.accuracies)), "seeds": len(self.accuracies), "l2": self.l2,
                "accuracies": [float(a) for a in self.accuracies], "val_accuracy": self.val_accuracy,
                "per_l2": self.per_l2}


def _check_pair(x: np.ndarray, y: np.ndarray, what: str) -> None:
    if np.ndim(x) != 2 or np.ndim(y) != 1 or len(x) != len(y):
        raise InputError(f"{what}: features must be [n, d] and labels [n], got {np.shape(x)} and {np.shape(y)}")


def _select(val: np.ndarray) -> int:
    """Index of the best mean validation accuracy; ties go to the strongest regularisation."""
    best = val.max()
    return max(i for i, v in enumerate(val) if v >= best - 1e-12)


def _pool_features(train_x: np.ndarray, train_y: np.ndarray, train_rows: Optional[np.ndarray]
                   ) -> Callable[[np.ndarray], np.ndarray]:
    """The features of training-pool examples by pool index: ``train_x`` itself, or through ``train_rows``
    when ``train_x`` holds only those rows (InputError for an index it lacks)."""
    if train_rows is None:
        _check_pair(train_x, train_y, "training set")
        return lambda idx: train_x[idx]
    train_rows = np.asarray(train_rows, dtype=np.int64)
    if np.ndim(train_x) != 2 or len(train_x) != len(train_rows):
        raise InputError(f"train_x has {len(train_x)} rows but train_rows lists {len(train_rows)}")
    where = np.full(len(train_y), -1, dtype=np.int64)
    where[train_rows] = np.arange(len(train_rows))

    def feats(idx: np.ndarray) -> np.ndarray:
        rows = where[idx]
        if (rows < 0).any():
            raise InputError("train_rows does not cover every example the sweep uses: pass "
                             "needed_indices(train_y, shots, seeds, val_per_class)")
        return train_x[rows]
    return feats


def _check_sweep(shots: Sequence[int], seeds: Sequence[int], l2s: List[float], val_per_class: int) -> None:
    if not shots or min(shots) < 1:
        raise InputError(f"shots must be positive integers, got {list(shots)}")
    if not seeds:
        raise InputError("give at least one seed")
    if not l2s:
        raise InputError("the L2 grid is empty")
    if len(l2s) > 1 and val_per_class < 1:
        raise InputError("choosing among several L2 strengths needs validation data: set val_per_class >= 1 "
                         "or give a single L2 value")


def fewshot_evaluate(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray, *,
                     shots: Sequence[int] = DEFAULT_SHOTS, seeds: Sequence[int] = (0, 1, 2, 3, 4),
                     l2_grid: Sequence[float] = DEFAULT_L2_GRID, val_per_class: int = 20,
                     num_classes: Optional[int] = None, train_rows: Optional[np.ndarray] = None) -> List[ShotResult]:
    """k-shot linear evaluation for every k in ``shots``, repeated over ``seeds``.

    For each seed, ``val_per_class`` validation examples and the k shots per
    class are drawn from the training pool (:func:`sample_shots`); each task
    is solved once for the whole ``l2_grid``; the L2 strength with the best
    mean validation accuracy over seeds is the one reported on the test set.

    ``train_y`` labels the whole training pool. ``train_x`` holds its
    features, or only those of the rows ``train_rows`` (e.g. the
    :func:`needed_indices` of the sweep, to save extracting the rest).
    """
    train_y = np.asarray(train_y)
    test_y = np.asarray(test_y)
    feats = _pool_features(train_x, train_y, train_rows)
    _check_pair(test_x, test_y, "test set")
    l2s = [float(v) for v in l2_grid]
    _check_sweep(shots, seeds, l2s, val_per_class)
    classes = np.unique(train_y)
    k_all = int(num_classes) if num_classes is not None else int(max(train_y.max(), test_y.max())) + 1
    results = []
    for k in shots:
        val_acc, test_acc = [], []
        for seed in seeds:
            idx, val_idx = sample_shots(train_y, k, seed, classes, val_per_class)
            solver = RidgeSolver(feats(idx), train_y[idx], k_all)
            if len(val_idx):
                val_acc.append(solver.accuracy(feats(val_idx), train_y[val_idx], l2s))
            test_acc.append(solver.accuracy(test_x, test_y, l2s))
        test_acc = np.stack(test_acc)
        val_mean = np.stack(val_acc).mean(0) if val_acc else np.full(len(l2s), np.nan)
        best = _select(val_mean) if val_acc else 0
        per_l2 = [{"l2": l2, "val": float(v), "test": float(t)}
                  for l2, v, t in zip(l2s, val_mean, test_acc.mean(0))]
        results.append(ShotResult(int(k), l2s[best], [float(a) for a in test_acc[:, best]],
                                  float(val_mean[best]), per_l2))
    return results


def linear_probe(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray, *,
                 l2_grid: Sequence[float] = DEFAULT_L2_GRID, val_fraction: float = 0.1, seed: int = 0,
                 num_classes: Optional[int] = None) -> Dict[str, object]:
    """The same closed-form probe on all training data.

    The L2 strength is chosen on a random ``val_fraction`` of the training
    set; the probe is then refitted on all of it and scored on the test set.
    """
    _check_pair(train_x, train_y, "training set")
    _check_pair(test_x, test_y, "test set")
    l2s = [float(v) for v in l2_grid]
    k_all = int(num_classes) if num_classes is not None else int(max(train_y.max(), test_y.max())) + 1
    if len(l2s) > 1:
        if not 0.0 < val_fraction < 1.0:
            raise InputError(f"val_fraction must be in (0, 1) to choose the L2 strength, got {val_fraction}")
        perm = np.random.default_rng(seed).permutation(len(train_y))
        n_val = max(1, int(round(val_fraction * len(train_y))))
        val_idx, fit_idx = perm[:n_val], perm[n_val:]
        solver = RidgeSolver(train_x[fit_idx], train_y[fit_idx], k_all)
        val = solver.accuracy(train_x[val_idx], train_y[val_idx], l2s)
        best = _select(val)
    else:
        val, best = np.full(1, np.nan), 0
    solver = RidgeSolver(train_x, train_y, k_all)
    test = float(solver.accuracy(test_x, test_y, [l2s[best]])[0])
    return {"accuracy": test, "l2": l2s[best], "val_accuracy": float(val[best]), "train_size": int(len(train_y)),
            "per_l2": [{"l2": l2, "val": float(v)} for l2, v in zip(l2s, val)]}


def evaluate_frozen(model, train_images, train_labels, test_images, test_labels, *,
                    representation: str = "pre_logits", shots: Sequence[int] = DEFAULT_SHOTS,
                    seeds: Sequence[int] = (0, 1, 2, 3, 4), l2_grid: Sequence[float] = DEFAULT_L2_GRID,
                    val_per_class: int = 20, probe: bool = False, probe_val_fraction: float = 0.1,
                    cache_dir=None, data_id: str = "", batch_size: int = 256, device=None,
                    progress: bool = True, num_classes: Optional[int] = None) -> Dict[str, object]:
    """Few-shot results (and optionally the linear probe on all training data) of one frozen model.

    Features come from :func:`vitkit.eval.features.cached_features`; without
    ``probe`` only the training images the few-shot tasks use are passed
    through the model. ``model=None`` with ``representation='pixels'`` gives
    the raw-pixel baseline. Returns a JSON-ready dict.
    """
    from .features import cached_features

    train_labels = np.asarray(train_labels)
    test_labels = np.asarray(test_labels)
    kw = dict(cache_dir=cache_dir, representation=representation, batch_size=batch_size, device=device,
              progress=progress)
    if probe:
        rows = np.arange(len(train_labels))
        train_x = cached_features(model, train_images, data_id=f"{data_id}/train", desc="train features", **kw)
    else:
        rows = needed_indices(train_labels, shots, seeds, val_per_class) if shots else np.arange(0)
        subset = train_images[rows] if len(rows) else train_images[:0]
        train_x = (cached_features(model, subset, data_id=f"{data_id}/train-subset", desc="train features", **kw)
                   if len(rows) else np.zeros((0, 1), np.float32))
    test_x = cached_features(model, test_images, data_id=f"{data_id}/test", desc="test features", **kw)
    out: Dict[str, object] = {"representation": representation, "feature_dim": int(test_x.shape[1]),
                              "train_pool": int(len(train_labels)), "test_size": int(len(test_labels)),
                              "seeds": [int(s) for s in seeds], "val_per_class": int(val_per_class)}
    if shots:
        res = fewshot_evaluate(train_x, train_labels, test_x, test_labels, shots=shots, seeds=seeds,
                               l2_grid=l2_grid, val_per_class=val_per_class, num_classes=num_classes,
                               train_rows=rows)
        out["fewshot"] = [r.to_dict() for r in res]
    if probe:
        out["linear_probe"] = linear_probe(train_x, train_labels, test_x, test_labels, l2_grid=l2_grid,
                                           val_fraction=probe_val_fraction, num_classes=num_classes)
    return out
