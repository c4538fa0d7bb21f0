"""Deterministic splits, epoch orders and batch loading.

The order of an epoch is a pure function of (seed, epoch): a resumed run sees exactly the batches it
would have seen, and a run on N processes sees the same global batches as a run on one (each rank
takes every N-th sample of the global batch).
"""
from __future__ import annotations

import os
from typing import Iterator, Optional, Tuple

import torch

from ..errors import ConfigError
from .datasets import Dataset


def split_indices(n: int, fraction: float, seed: int = 0, labels: Optional[torch.Tensor] = None
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(train, held-out) indices: a seeded, class-stratified hold-out of ``fraction`` of ``n`` samples
    (the paper holds out 1-10 % of the training set to choose hyper-parameters). Sorted, disjoint,
    identical for the same (n, fraction, seed)."""
    if not 0 <= fraction < 1:
        raise ConfigError(f"val_fraction must be in [0, 1), got {fraction}")
    g = torch.Generator().manual_seed(int(seed) + 7919)
    if fraction == 0 or n == 0:
        return torch.arange(n), torch.zeros(0, dtype=torch.int64)
    if labels is None:
        perm = torch.randperm(n, generator=g)
        k = max(1, int(round(n * fraction)))
        return perm[k:].sort().values, perm[:k].sort().values
    # each class gives its share, rounded so that the shares add up to round(n * fraction) exactly
    # (largest remainders first)
    classes = torch.unique(labels)
    counts = torch.stack([(labels == c).sum() for c in classes]).double()
    exact = counts * fraction
    quota = exact.floor().long()
    short = int(round(n * fraction)) - int(quota.sum())
    if short > 0:
        quota[(exact - quota).argsort(descending=True, stable=True)[:short]] += 1
    held = []
    for c, k in zip(classes, quota.tolist()):
        idx = (labels == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        held.append(idx[:k])
    held_idx = torch.cat(held).sort().values
    mask = torch.ones(n, dtype=torch.bool)
    mask[held_idx] = False
    return mask.nonzero().flatten(), held_idx


class EpochSampler:
    """Global batches of ``batch_size`` indices per step; this rank gets every ``world``-th of each.

    ``repeats`` > 1 is repeated augmentation: each drawn image appears ``repeats`` times in a row (so in
    one global batch, split across ranks), keeping the epoch at ``n`` samples."""

    def __init__(self, n: int, batch_size: int, *, shuffle: bool = True, seed: int = 0, rank: int = 0,
                 world: int = 1, repeats: int = 1, drop_last: bool = True):
        if batch_size % world:
            raise ConfigError(f"global batch {batch_size} is not divisible by {world} processes")
        if batch_size > n and drop_last:
            raise ConfigError(f"batch size {batch_size} is larger than the dataset ({n} images): lower it")
        self.n, self.batch_size, self.shuffle, self.seed = n, batch_size, shuffle, seed
        self.rank, self.world, self.repeats, self.drop_last = rank, world, repeats, drop_last

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def order(self, epoch: int) -> torch.Tensor:
        """The permutation of the dataset's indices for ``epoch`` (a function of the seed and the epoch)."""
        if not self.shuffle:
            return torch.arange(self.n)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        perm = torch.randperm(self.n, generator=g)
        if self.repeats > 1:
            perm = perm[: -(-self.n // self.repeats)].repeat_interleave(self.repeats)[: self.n]
        return perm

    def batches(self, epoch: int, start: int = 0) -> Iterator[torch.Tensor]:
        """The index batches of ``epoch``, from batch ``start`` on (an exact resume mid-epoch)."""
        order = self.order(epoch)
        for b in range(start, len(self)):
            glob = order[b * self.batch_size:(b + 1) * self.batch_size]
            yield glob[self.rank::self.world]


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Loader:
    """Yields (uint8 images, labels) batches of an epoch, from batch ``start`` on.

    In-memory datasets are gathered by indexing; file datasets are decoded by ``workers`` processes
    (torch DataLoader) with the same index lists, so the order does not depend on the worker count."""

    def __init__(self, data: Dataset, sampler: EpochSampler, workers: int = 0):
        # more decoding processes than usable cores only adds contention (and a warning from torch)
        self.data, self.sampler, self.workers = data, sampler, min(int(workers), usable_cores())

    def __len__(self) -> int:
        return len(self.sampler)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """(images, labels) batches of ``epoch`` from batch ``start``: gathered in memory, or decoded by the
        worker processes."""
        if self.data.in_memory or self.workers <= 0:
            for idx in self.sampler.batches(epoch, start):
                yield self.data.gather(idx)
            return
        from torch.utils.data import DataLoader

        index_lists = [idx.tolist() for idx in self.sampler.batches(epoch, start)]
        dl = DataLoader(self.data, batch_sampler=index_lists, num_workers=self.workers, collate_fn=_collate,
                        persistent_workers=False, prefetch_factor=4)
        yield from dl


def _collate(samples):
    return torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples], dtype=torch.int64)


def eval_batches(data: Dataset, batch_size: int, rank: int = 0, world: int = 1,
                 workers: int = 0) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """Every sample exactly once, in order; with ``world`` > 1 each rank takes a contiguous share."""
    n = len(data)
    lo, hi = n * rank // world, n * (rank + 1) // world
    sampler = _Range(lo, hi, batch_size)
    return Loader(data, sampler, workers).epoch(0)


class _Range(EpochSampler):
    def __init__(self, lo: int, hi: int, batch_size: int):
        self.lo, self.hi, self.batch_size = lo, hi, batch_size
        self.drop_last = False
        self.n = hi - lo

    def batches(self, epoch: int, start: int = 0) -> Iterator[torch.Tensor]:
        for b in range(self.lo + start * self.batch_size, self.hi, self.batch_size):
            yield torch.arange(b, min(b + self.batch_size, self.hi))
