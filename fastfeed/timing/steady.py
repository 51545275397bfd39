"""Where steady state begins in a stream of batch arrival times (pure functions, no clock).

:func:`fastfeed.timing.measure.measure` records when every batch arrives; this module decides
which of them are steady state. A loader's first batches are not: worker processes
start one after another, the batches of early workers pile up in the prefetch queue
while a late worker's batch is awaited (batches are delivered in order), and the pile
then drains in a burst far faster than the workers can sustain.

The rule, in two steps:

1. **Every worker has delivered**: no batch before index ``num_workers`` (one per
   worker; ``warmup`` batches when the caller fixes the warm-up) nor within ``settle``
   seconds of the first batch is a candidate.
2. **The queue has drained to its steady level**: the candidates are cut into blocks
   (whole rounds of the workers, at least :data:`MIN_BLOCK` batches) and each block's
   seconds per sample is one observation. The start is cut where the marginal standard
   error of the remaining blocks' mean is smallest (MSER, White 1997, the standard
   truncation rule for the initial transient of simulation output), searched over
   the first half of the blocks only. The remainder must then be stationary: the mean
   of its first half and of its second half agree within ``max_drift`` (or within
   twice their standard error, on a noisy machine). If not, the transient is still
   running and steady state is not reached yet.

Example:
    >>> times = [2.0, 2.001, 2.002, 2.003] + [2.003 + 0.1 * k for k in range(1, 41)]
    >>> s = find_steady_start(times, [10] * len(times), num_workers=2)
    >>> s.steady, s.index >= 4
    (True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["MIN_BLOCK", "SteadyStart", "block_size", "find_steady_start", "first_candidate"]

#: Fewest batches in a block (MSER-5's batch size): single batches are too noisy.
MIN_BLOCK = 5
#: Fewest blocks that must remain after the cut.
MIN_TAIL_BLOCKS = 4


@dataclass(frozen=True)
class SteadyStart:
    """Where steady state begins, or why it was not found.

    Attributes:
        index: first steady batch (its time is measured from the batch before it);
            with ``steady`` False, the best guess (or None when there is no candidate).
        steady: whether the batches from ``index`` on are steady state.
        drift: relative difference of the two halves' rates after the cut (NaN if unknown).
        reason: why not steady ("" when steady).
    """

    index: int | None
    steady: bool
    drift: float = math.nan
    reason: str = ""


def block_size(num_workers: int) -> int:
    """Batches per block: whole rounds of the workers, at least :data:`MIN_BLOCK` batches.

    Example:
        >>> block_size(0), block_size(2), block_size(4), block_size(24)
        (5, 6, 8, 24)
    """
    if num_workers <= 0:
        return MIN_BLOCK
    return num_workers * math.ceil(MIN_BLOCK / num_workers)


def first_candidate(times: Sequence[float], *, skip: int, settle: float) -> int | None:
    """First index that may be steady: ``>= max(1, skip)`` and ``settle`` s after batch 0.

    Batch ``k`` is timed from batch ``k - 1``, so batch 0 (start-up) never is.

    Example:
        >>> first_candidate([0.0, 0.1, 0.2, 0.3, 0.4], skip=2, settle=0.25)
        4
    """
    if not times:
        return None
    k = max(1, skip)
    while k < len(times) and times[k - 1] - times[0] < settle:
        k += 1
    return k if k < len(times) else None


def _mser_cut(y: np.ndarray) -> int:
    """Blocks to cut: argmin over d <= m/2 of var(y[d:]) / (m - d) (MSER)."""
    m = len(y)
    tail_n = np.arange(m, 0, -1, dtype=float)  # m - d
    s1 = np.cumsum(y[::-1])[::-1]
    s2 = np.cumsum((y * y)[::-1])[::-1]
    stat = (s2 - s1 * s1 / tail_n) / (tail_n * tail_n)
    limit = max(0, min(m // 2, m - MIN_TAIL_BLOCKS))
    stat = stat[: limit + 1]
    eps = 1e-9 * float(np.mean(y)) ** 2  # rounding: equal statistics keep the earliest cut
    return int(np.flatnonzero(stat <= stat.min() + eps)[0])


def find_steady_start(
    times: Sequence[float],
    sizes: Sequence[int],
    *,
    num_workers: int = 0,
    skip: int | None = None,
    settle: float = 0.0,
    max_drift: float = 0.10,
) -> SteadyStart:
    """Find the first steady batch of one stream of arrivals (see the module docstring).

    Args:
        times: arrival time of every batch of the stream, batch 0 first.
        sizes: samples in each batch.
        num_workers: the loader's workers (one round of them is a block).
        skip: batches that can never be steady (default ``num_workers``: each worker's first).
        settle: seconds after batch 0 before steady state may begin.
        max_drift: largest relative rate difference between the two halves of the
            steady part that still counts as stationary (raised to twice their standard
            error when the blocks are noisy).

    Returns:
        A :class:`SteadyStart`.

    Example:
        >>> find_steady_start([0.0, 1.0], [8, 8]).reason
        'too few batches after warm-up (1; 20 needed)'
    """
    block = block_size(num_workers)
    k0 = first_candidate(times, skip=num_workers if skip is None else skip, settle=settle)
    need = block * MIN_TAIL_BLOCKS
    have = 0 if k0 is None else len(times) - k0
    if k0 is None or have < need:
        return SteadyStart(k0, False, reason=f"too few batches after warm-up ({have}; {need} needed)")
    m = have // block
    t = np.asarray(times, dtype=float)
    n = np.asarray(sizes, dtype=float)
    starts = k0 + block * np.arange(m)
    ends = starts + block  # exclusive
    seconds = t[ends - 1] - t[starts - 1]
    samples = np.add.reduceat(n[k0:k0 + m * block], np.arange(0, m * block, block))
    y = seconds / np.maximum(samples, 1)  # seconds per sample of each block
    d = _mser_cut(y)
    tail = y[d:]
    h = len(tail) // 2
    a, b = float(tail[:h].mean()), float(tail[len(tail) - h:].mean())
    if min(a, b) <= 0:
        return SteadyStart(k0 + d * block, False, math.inf, "batches arrived with no time between them")
    drift = abs(a - b) / min(a, b)
    cv = float(tail.std() / tail.mean())
    allowed = max(max_drift, 2 * cv * math.sqrt(2 / h))
    if drift > allowed:
        return SteadyStart(k0 + d * block, False, drift,
                           f"throughput still changing ({drift:.0%} between the halves of the last "
                           f"{len(tail)} rounds)")
    return SteadyStart(k0 + d * block, True, drift)
