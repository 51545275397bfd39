"""Mixing datasets by weight: which dataset fills each position of an epoch.

Design. A mixed epoch is a sequence of ``epoch_samples`` positions ``g = 0, 1, ...``;
position ``g`` belongs to dataset ``source(g)``, a pure function of ``g`` and the
weights, the same on every rank and for every world shape. ``C_k(g)``, the number of
positions of dataset ``k`` before ``g``, is computed in closed form by nested rounding:
datasets in descending weight ``k1, k2, ...``; ``C_k1(g) = round(g * p_k1)``, the
remaining ``g - C_k1(g)`` positions are shared the same way between ``k2`` and the rest,
and so on, with each ratio held as an exact fraction (denominator <= 2**20) in integer
arithmetic. Each ``C_k`` is non-decreasing and grows by 0 or 1 per position, so every
position has exactly one dataset, and any window of ``B`` consecutive positions holds
``B * p_k`` of dataset ``k`` up to rounding: for two datasets exactly ``floor`` or
``ceil``; with more, within 2. Over an epoch dataset ``k`` gets ``C_k(E)`` positions,
``E * p_k`` rounded.

Each dataset is read as an endless *stream* of complete passes: stream position ``m``
is position ``m mod n`` of pass ``m // n``, a pass being the shard-contiguous shuffled
order of :func:`fastfeed.loading.order.epoch.order_span` over the dataset's kept samples with
``epoch=pass``. Epoch ``e`` consumes stream positions ``[e * C_k(E), (e + 1) * C_k(E))``,
so a smaller dataset is cycled through complete reshuffled passes (a pass never repeats
a sample) and carries on across epochs where it stopped. The default epoch length is
the smallest ``E`` with ``C_k(E) = n_k`` for the largest-weight dataset ``k``, so that
dataset is read exactly once per epoch (pass ``e`` in epoch ``e``: with one dataset the
order is exactly :func:`~fastfeed.loading.order.epoch.epoch_order`'s).

Example:
    >>> pat = mix_pattern([3, 1])
    >>> pat.sources(0, 8).tolist()
    [0, 0, 1, 0, 0, 0, 1, 0]
    >>> default_epoch_samples(pat, [6, 100])
    8
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np

from fastfeed.errors import ConfigError
from fastfeed.loading.order.epoch import order_span
from fastfeed.loading.order.selection import Selection

__all__ = [
    "MAX_POSITIONS",
    "MixPattern",
    "check_positions",
    "dataset_seed",
    "default_epoch_samples",
    "mix_pattern",
    "stream_ids",
]

#: Positions of one epoch must stay below this (the integer arithmetic of ``C_k`` fits int64).
MAX_POSITIONS = 1 << 41
_DEN = 1 << 20
_MIX_STREAM = 0x5EED_0010


@dataclass(frozen=True)
class MixPattern:
    """Normalised weights and the nested-rounding chain behind :meth:`counts_before`.

    Attributes:
        probabilities: float64 (K,) the normalised weights, in the caller's dataset order.
        chain: int64 (K,) datasets in descending weight (ties: the caller's order).
        num, den: int64 (K - 1,) the ratio of each chain step, ``num / den <= 1``.
    """

    probabilities: np.ndarray
    chain: np.ndarray
    num: np.ndarray
    den: np.ndarray

    @property
    def num_datasets(self) -> int:
        return int(self.probabilities.shape[0])

    def counts_before(self, g: np.ndarray) -> np.ndarray:
        """int64 (K, len(g)): positions of each dataset among ``[0, g)``, per ``g``.

        Example:
            >>> mix_pattern([1, 1]).counts_before(np.array([0, 1, 2, 3])).tolist()
            [[0, 1, 1, 2], [0, 0, 1, 1]]
        """
        rest = np.asarray(g, dtype=np.int64)
        out = np.empty((self.num_datasets, rest.shape[0]), dtype=np.int64)
        for step, k in enumerate(self.chain[:-1]):
            a, b = int(self.num[step]), int(self.den[step])
            c = (2 * a * rest + b) // (2 * b)  # floor(rest * a / b + 1/2), exact
            out[k] = c
            rest = rest - c
        out[self.chain[-1]] = rest
        return out

    def sources(self, start: int, stop: int) -> np.ndarray:
        """int64 dataset of each position in ``[start, stop)``.

        Example:
            >>> mix_pattern([1, 1]).sources(0, 4).tolist()
            [0, 1, 0, 1]
        """
        c = self.counts_before(np.arange(start, stop + 1, dtype=np.int64))
        return np.argmax(np.diff(c, axis=1), axis=0).astype(np.int64) if stop > start else np.zeros(0, np.int64)


def mix_pattern(weights: Sequence[float] | np.ndarray | None, num_datasets: int | None = None) -> MixPattern:
    """Validate ``weights=`` (any positive total; normalised) into a :class:`MixPattern`.

    Args:
        weights: one non-negative weight per dataset, or None for one dataset.
        num_datasets: the number of datasets, when known, to check the length.

    Raises:
        ConfigError: wrong length, a negative or non-finite weight, or all zero.

    Example:
        >>> mix_pattern([7, 3]).probabilities.tolist()
        [0.7, 0.3]
    """
    if weights is None:
        if num_datasets not in (None, 1):
            raise ConfigError(f"weights=None with {num_datasets} datasets; pass one weight per dataset, "
                              f"e.g. weights={[1] * int(num_datasets)} for equal shares")
        weights = [1.0]
    w = np.asarray(weights, dtype=np.float64).ravel() if np.ndim(weights) else np.zeros(0)
    if num_datasets is not None and w.shape[0] != num_datasets:
        raise ConfigError(f"weights= has {w.shape[0]} entries for {num_datasets} datasets; pass one weight per "
                          "dataset, in the order of the paths")
    if w.shape[0] == 0 or not np.isfinite(w).all() or (w < 0).any():
        raise ConfigError(f"weights={list(weights)!r}: every weight must be a finite number >= 0")
    if not w.sum() > 0:
        raise ConfigError(f"weights={list(weights)!r} are all zero; give at least one dataset a positive weight")
    fr = [Fraction(float(x)).limit_denominator(_DEN) if x > 0 else Fraction(0) for x in w / w.max()]
    chain = np.argsort(-w, kind="stable").astype(np.int64)
    num, den, left = [], [], sum(fr)
    for k in chain[:-1]:
        q = (fr[int(k)] / left).limit_denominator(_DEN) if left > 0 else Fraction(0)
        num.append(q.numerator)
        den.append(q.denominator)
        left -= fr[int(k)]
    return MixPattern(probabilities=w / w.sum(), chain=chain, num=np.array(num, dtype=np.int64),
                      den=np.array(den, dtype=np.int64))


def default_epoch_samples(pattern: MixPattern, sizes: Sequence[int]) -> int:
    """The smallest epoch that reads the largest-weight dataset exactly once.

    Example:
        >>> default_epoch_samples(mix_pattern([0.7, 0.3]), [700, 10])
        1000
    """
    k = int(pattern.chain[0])
    n = int(sizes[k])
    if pattern.num_datasets == 1:
        return n
    a, b = int(pattern.num[0]), int(pattern.den[0])
    e = max(0, -(-(2 * n - 1) * b // (2 * a)))  # smallest g with floor(g a / b + 1/2) >= n
    while int(pattern.counts_before(np.array([e]))[k, 0]) < n:  # guards the rounding identity
        e += 1
    return e


def dataset_seed(seed: int, k: int) -> int:
    """The shuffle seed of dataset ``k`` of a mixture: ``seed`` itself for the first.

    Example:
        >>> dataset_seed(7, 0), dataset_seed(7, 1) != 7
        (7, True)
    """
    if k == 0:
        return int(seed)
    return int(np.random.SeedSequence([_MIX_STREAM, int(seed), int(k)]).generate_state(1, np.uint64)[0] >> 1)


def stream_ids(sel: Selection, *, seed: int, shuffle: bool, start: int, stop: int) -> np.ndarray:
    """Global sample ids at stream positions ``[start, stop)`` of one dataset (see above).

    Example:
        >>> from fastfeed.loading.order.selection import select
        >>> stream_ids(select([2, 2]), seed=0, shuffle=False, start=3, stop=6).tolist()
        [3, 0, 1]
    """
    n = sel.size
    parts: list[np.ndarray] = []
    pos = int(start)
    while pos < stop:
        p, j = divmod(pos, n)
        take = min(int(stop) - pos, n - j)
        v = order_span(sel.kept_counts, seed=seed, epoch=p, shuffle=shuffle, start=j, stop=j + take)
        parts.append(sel.ids(v))
        pos += take
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def check_positions(epoch_samples: int) -> int:
    """Validate ``epoch_samples=`` (an integer in ``[1, MAX_POSITIONS)``).

    Example:
        >>> check_positions(1000)
        1000
    """
    if isinstance(epoch_samples, bool) or not isinstance(epoch_samples, (int, np.integer)):
        raise ConfigError(f"epoch_samples={epoch_samples!r} must be a positive integer (samples per epoch)")
    if not 1 <= int(epoch_samples) < MAX_POSITIONS:
        raise ConfigError(f"epoch_samples={epoch_samples} must be in [1, {MAX_POSITIONS}); "
                          f"{math.log2(MAX_POSITIONS):.0f} bits bound one epoch's positions")
    return int(epoch_samples)
