"""Where rank and world size come from, in one place.

Order (the first that answers wins):

1. explicit ``rank`` / ``world_size`` arguments;
2. an initialised ``torch.distributed`` process group;
3. the ``RANK`` / ``WORLD_SIZE`` environment variables (set by torchrun), read at call time;
4. a single process: rank 0 of 1.

``LOCAL_WORLD_SIZE`` (processes on this host) follows the same idea.

Example:
    >>> resolve_world(rank=1, world_size=4)
    (1, 4)
"""

from __future__ import annotations

import os
from numbers import Integral
from typing import Any

from fastfeed.errors import ConfigError

__all__ = ["MAX_WORLD_SIZE", "check_rank", "local_world_size", "resolve_world"]

#: The most ranks a world may have (2**20): far beyond any cluster, and small enough that every
#: per-rank array of the plan fits in memory.
MAX_WORLD_SIZE = 1 << 20


def _from_torch() -> tuple[int, int] | None:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a core dependency
        return None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def check_rank(value: Any, name: str) -> int | None:
    """A rank or world size as given: an int (numpy integers too), or None (found by the order above).

    The range is :func:`resolve_world`'s to check, once both are known.

    Raises:
        ConfigError: anything else, naming ``name`` (``rank="0"``).

    Example:
        >>> check_rank(3, "rank"), check_rank(None, "world_size")
        (3, None)
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral):
        hint = f"; pass {name}={int(value)}" if isinstance(value, str) and value.strip().isdigit() else ""
        raise ConfigError(f"{name}={value!r} must be an integer (or None: from torch.distributed, then the "
                          f"environment), not {type(value).__name__}{hint}")
    return int(value)


def resolve_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """Return (rank, world_size) by the documented order; validates the result.

    Raises:
        ConfigError: a rank or world size that is not an integer (``rank="0"``), or out of range.

    Example:
        >>> resolve_world(rank="0", world_size=2)
        Traceback (most recent call last):
        ...
        fastfeed.errors.ConfigError: rank='0' must be an integer (or None: from torch.distributed, then the environment), not str; pass rank=0
    """
    rank, world_size = check_rank(rank, "rank"), check_rank(world_size, "world_size")
    if rank is None or world_size is None:
        found = _from_torch()
        if found is None and "WORLD_SIZE" in os.environ:
            try:
                found = (int(os.environ.get("RANK", "0")), int(os.environ["WORLD_SIZE"]))
            except ValueError:
                raise ConfigError(
                    f"RANK={os.environ.get('RANK')!r} / WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} "
                    "are not integers; fix the environment or pass rank= and world_size="
                ) from None
        if found is None:
            found = (0, 1)
        rank = found[0] if rank is None else rank
        world_size = found[1] if world_size is None else world_size
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ConfigError(f"world_size={world_size} must be from 1 to {MAX_WORLD_SIZE:,} (ranks)")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank={rank} must be in [0, {world_size}) for world_size={world_size}")
    return int(rank), int(world_size)


def local_world_size() -> int:
    """Processes sharing this host: ``LOCAL_WORLD_SIZE`` when set (torchrun), else 1."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1
