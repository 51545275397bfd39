"""What ``fastfeed tune`` may vary: settings, the search space, and decode-mode knobs.

A :class:`Setting` is what ``fastfeed.loader()`` is given: ``num_workers``,
``prefetch_factor`` and the decode mode's own knobs. A :class:`SearchSpace` says which
values exist. Each decode mode may contribute its own knobs: define ``TUNE_SPACE =
SearchSpace(...)`` in the decode module and name it in :data:`DECODE_SPACES`; it is
imported only when that mode is tuned. Each :class:`Knob` names the ``loader()``
keyword it sets, lists candidate values cheapest first (or computes them from the
cores per rank) and gives the default used while the rest is searched. For example,
a GPU decoder whose pipeline owns its threads::

    TUNE_SPACE = SearchSpace(
        workers=(0,),                      # no DataLoader workers in this mode
        knobs=(
            Knob("num_threads", lambda cores: [n for n in (1, 2, 4, 8) if n <= cores], default=4),
            Knob("hw_decoder_load", (0.0, 0.5, 0.75, 0.9), default=0.75),
            Knob("prefetch_queue_depth", (1, 2, 3), default=2),
        ),
    )

Example:
    >>> space_for("cpu").knobs, worker_ladder(6)
    ((), [0, 1, 2, 3, 4, 6])
    >>> Setting(4, 2).with_knob("num_threads", 4).loader_kwargs()
    {'num_workers': 4, 'prefetch_factor': 2, 'num_threads': 4}
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from fastfeed.errors import ConfigError

__all__ = ["DECODE_SPACES", "Knob", "SearchSpace", "Setting", "space_for", "worker_ladder"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Knob:
    """A decode-mode setting the tuner searches.

    Attributes:
        name: the ``fastfeed.loader()`` keyword it sets.
        values: candidate values, cheapest first, or a function of the cores per rank
            returning them (e.g. thread counts up to the cores).
        default: the value used while other parts of the setting are searched.
        help: one line for ``fastfeed tune`` output.
        uses_cores: the value is a number of busy CPU threads (e.g. decode threads); it
            counts with the workers when tune says how many cores are left to training.
        scales: names of other knobs (numbers of threads) that grow in proportion with
            this one: when the search tries a new value of this knob it also tries each
            named knob scaled by new / current value (capped at its largest candidate),
            e.g. two pipelines with twice the threads of one.
    """

    name: str
    values: Sequence[Any] | Callable[[int], Sequence[Any]]
    default: Any
    help: str = ""
    uses_cores: bool = False
    scales: tuple[str, ...] = ()

    def candidates(self, cores_per_rank: int) -> tuple[Any, ...]:
        vals = self.values(cores_per_rank) if callable(self.values) else self.values
        return tuple(vals)


@dataclass(frozen=True)
class SearchSpace:
    """What the tuner may vary for one decode mode.

    Attributes:
        workers: fixed worker counts to consider, or None for the ladder up to the cap.
        prefetch: prefetch factors to consider (ascending).
        default_prefetch: the factor used while workers are climbed (PyTorch's 2).
        knobs: the decode mode's own settings.
    """

    workers: tuple[int, ...] | None = None
    prefetch: tuple[int, ...] = (1, 2, 4, 8)
    default_prefetch: int = 2
    knobs: tuple[Knob, ...] = ()

    def cores_used(self, setting: "Setting") -> int:
        """CPU cores a setting keeps busy: its workers plus knobs that are thread counts."""
        knobs = dict(setting.knobs)
        threads = sum(int(knobs.get(k.name, k.default)) for k in self.knobs if k.uses_cores)
        return setting.num_workers + threads


#: decode mode -> "module:attribute" of its SearchSpace, imported only when tuned.
DECODE_SPACES: dict[str, str] = {
    "dali": "fastfeed.loading.dali.backend:TUNE_SPACE",
}


def space_for(decode: str | None) -> SearchSpace:
    """The search space of a decode mode (the plain workers/prefetch space by default).

    Example:
        >>> space_for("cpu").knobs
        ()
    """
    ref = DECODE_SPACES.get(str(decode))
    if ref is None:
        return SearchSpace()
    module, _, attr = ref.partition(":")
    try:
        space = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        log.debug("no tune space for decode=%r (%s); searching workers/prefetch only", decode, e)
        return SearchSpace()
    if not isinstance(space, SearchSpace):
        raise ConfigError(f"{ref} is a {type(space).__name__}, expected fastfeed.tuning.search.SearchSpace")
    return space


@dataclass(frozen=True)
class Setting:
    """One point of the space: what ``loader()`` is given.

    Attributes:
        num_workers: DataLoader worker processes.
        prefetch_factor: batches in flight per worker (None with 0 workers).
        knobs: the decode mode's settings, as sorted (name, value) pairs.
    """

    num_workers: int
    prefetch_factor: int | None = None
    knobs: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.num_workers == 0 and self.prefetch_factor is not None:
            object.__setattr__(self, "prefetch_factor", None)

    def loader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``fastfeed.loader()``."""
        return {"num_workers": self.num_workers, "prefetch_factor": self.prefetch_factor,
                **dict(self.knobs)}

    def with_knob(self, name: str, value: Any) -> "Setting":
        knobs = dict(self.knobs)
        knobs[name] = value
        return replace(self, knobs=tuple(sorted(knobs.items())))

    @property
    def label(self) -> str:
        parts = [f"workers={self.num_workers}",
                 f"prefetch={self.prefetch_factor if self.prefetch_factor is not None else '-'}"]
        parts += [f"{k}={v}" for k, v in self.knobs]
        return " ".join(parts)


def worker_ladder(cap: int) -> list[int]:
    """0, 1, 2, 3, 4, 6, 8, 12, 16, 24, ... up to ``cap`` (always ending at ``cap``).

    Example:
        >>> worker_ladder(10)
        [0, 1, 2, 3, 4, 6, 8, 10]
    """
    rungs = [0, 1, 2, 3, 4]
    k = 4
    while k < cap:
        rungs += [k + k // 2, 2 * k]
        k *= 2
    out = sorted({r for r in rungs if r <= cap} | {max(0, cap)})
    return out
