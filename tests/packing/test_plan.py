"""plan.py: how the planner cuts a source's units into shards (samples dealt evenly, blocks greedily)."""

from __future__ import annotations

import pytest

from fastfeed.errors import ConfigError
from fastfeed.packing.options import PackOptions
from fastfeed.packing.plan import group_units, shard_counts


@pytest.mark.parametrize("n,per,expected", [(10, 4, [4, 3, 3]), (9, 3, [3, 3, 3]), (7, 100, [7]),
                                            (1001, 100, [91] * 11), (5, 1, [1] * 5)])
def test_shard_counts_balanced(n: int, per: int, expected: list[int]) -> None:
    assert shard_counts(n, [1] * n, PackOptions(samples_per_shard=per)) == expected


def test_shard_counts_by_bytes_stay_within_one() -> None:
    counts = shard_counts(10, [30] * 10, PackOptions(shard_size=100))
    assert counts == [4, 3, 3] and sum(counts) == 10


@pytest.mark.parametrize("sizes,rows,limit,per,expected", [
    ([100] * 4, [3, 3, 3, 1], 250, None, [(0, 2), (2, 4)]),            # up to the byte limit
    ([100] * 4, [3, 3, 3, 1], 10**9, 6, [(0, 2), (2, 4)]),             # up to the row limit
    ([100, 900, 100], [1, 9, 1], 250, None, [(0, 1), (1, 2), (2, 3)]),  # a large block is a shard alone
    ([10] * 5, [1] * 5, 1, None, [(i, i + 1) for i in range(5)]),
    ([], [], 100, None, []),
])
def test_group_units_keeps_blocks_whole_and_in_order(sizes: list[int], rows: list[int], limit: int,
                                                     per: int | None, expected: list[tuple[int, int]]) -> None:
    groups = group_units(sizes, rows, limit, per)
    assert groups == expected
    assert [i for a, b in groups for i in range(a, b)] == list(range(len(sizes)))


def test_group_units_refuses_limits_that_are_not_positive() -> None:
    with pytest.raises(ConfigError, match="must be positive"):
        group_units([1], [1], 0)
