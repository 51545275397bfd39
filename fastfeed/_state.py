"""Versioned state dicts: one description of a layout, its checks and their messages.

Every ``state_dict()`` of fastfeed (the loader's, :mod:`fastfeed.loading.order.state`; the
length samplers', :mod:`fastfeed.sampling.samplers`) is a flat dict of a few ints and
strings under the same rules, written here once:

- a version field names the layout; the versions read are listed, an older one is read
  as it was written, a newer one asks for a newer fastfeed;
- every field the reading object writes at that version is present;
- counts and sizes are integers >= 0 (never bools, floats or strings);
- ``stages`` lists every shape the epoch ran at, the current one last: one row of
  columns per shape, the count consumed at it last; the last row's count is the state's
  position (``batches``, ``step``); a version-1 state (no ``stages``) is its one stage;
- a stage consumed at most what its epoch had at that shape;
- what the order depends on matches, and the error names every difference.

:class:`StateLayout` describes one layout (frozen, built once at import) and
:class:`Stages` the rows of its ``stages``. Each raises
:class:`~fastfeed.errors.StateError` with what is wrong, in which field, and the fix.
The rules that differ between the owners (which fields must match, how many batches a
stage had) stay with them and are handed in.

Example:
    >>> TOY = StateLayout("toy state", version_key="toy", version=2, source="Toy.state_dict()",
    ...                   ints=("epoch", "step"), stages=Stages((("world_size", 1), ("steps", 0))),
    ...                   count_key="step", v1_stage=lambda s: (s["world_size"], s["step"]))
    >>> state = {"toy": 2, "epoch": 0, "step": 3, "stages": [[4, 2], [2, 3]]}
    >>> TOY.read_stages(state, TOY.check(state))
    ((4, 2), (2, 3))
    >>> TOY.write_stages([(4, 2)], (2, 3)) == state["stages"]
    True
    >>> TOY.read_stages({"toy": 1, "epoch": 0, "step": 3, "world_size": 2}, 1)
    ((2, 3),)
    >>> TOY.check({"toy": 2, "epoch": 0, "step": 3.0, "stages": [[2, 3]]})
    Traceback (most recent call last):
    ...
    fastfeed.errors.StateError: toy state: step=3.0 is not an integer >= 0; pass the dict from Toy.state_dict() unchanged (a checkpoint format that turns integers into floats or strings breaks it)
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

from fastfeed.errors import ConfigError, StateError

__all__ = ["MAX_EPOCH", "Rule", "StateLayout", "Stages", "check_epoch", "differences", "read_int"]

#: The largest epoch a loader or sampler runs (2**62): far beyond any training run, and small
#: enough that the epoch and the epoch after it fit the signed 64-bit integers the plan is
#: shared with its workers in (an epoch of 2**63 overflowed deep inside).
MAX_EPOCH = 1 << 62

#: The rule of one stage column: an ``int`` is the least value of an integer column, a
#: tuple of strings the words a word column may hold.
Rule = Union[int, tuple[str, ...]]

def _whole(v: Any) -> bool:
    return isinstance(v, Integral) and not isinstance(v, bool)


def _int_error(text: str, v: Any, least: int, fix: str, most: int | None = None) -> StateError:
    """``<text> an integer >= least; <fix>`` and the likely cause: a lossy checkpoint format, or an edit."""
    above = most is not None and _whole(v) and v > most
    rule = f"an integer from {least} to {most}" if above else f"an integer >= {least}"
    bound = f"never above {most}" if above else f"never below {least}"
    cause = (f" (its integers are {bound}; was it edited?)" if _whole(v) else
             " unchanged (a checkpoint format that turns integers into floats or strings breaks it)")
    return StateError(f"{text} {rule}; {fix}{cause}")


def check_epoch(epoch: Any, where: str) -> int:
    """``epoch`` as an int if it is an integer from 0 to :data:`MAX_EPOCH` (numpy's too, not a bool).

    Args:
        epoch: the value given.
        where: the call, for the message (``"set_epoch"``).

    Raises:
        ConfigError: naming the call, the value and the range.

    Example:
        >>> check_epoch(3, "set_epoch")
        3
        >>> check_epoch(2**63, "set_epoch")
        Traceback (most recent call last):
        ...
        fastfeed.errors.ConfigError: set_epoch(9223372036854775808): the epoch is an integer from 0 to 2**62 (4611686018427387904)
    """
    if not _whole(epoch) or not 0 <= epoch <= MAX_EPOCH:
        raise ConfigError(f"{where}({epoch!r}): the epoch is an integer from 0 to 2**62 ({MAX_EPOCH})")
    return int(epoch)


def read_int(state: Mapping[str, Any], key: str, *, what: str, fix: str, least: int = 0,
             most: int | None = None) -> int:
    """``state[key]`` as an int, checked: an integer (not a bool) of at least ``least`` (at most ``most``).

    Args:
        state: the state dict (``key`` present).
        key: the field.
        what: how the message names the state (``"loader state"``).
        fix: what to do instead (``"pass the dict from Loader.state_dict()"``).
        least: the smallest value allowed.
        most: the largest value allowed (None: no bound).

    Raises:
        StateError: naming the field, its value and ``fix``.

    Example:
        >>> read_int({"epoch": 2}, "epoch", what="toy state", fix="pass Toy.state_dict()")
        2
        >>> read_int({"epoch": "2"}, "epoch", what="toy state", fix="pass Toy.state_dict()")
        Traceback (most recent call last):
        ...
        fastfeed.errors.StateError: toy state: epoch='2' is not an integer >= 0; pass Toy.state_dict() unchanged (a checkpoint format that turns integers into floats or strings breaks it)
    """
    v = state[key]
    if not _whole(v) or v < least or (most is not None and v > most):
        raise _int_error(f"{what}: {key}={v!r} is not", v, least, fix, most)
    return int(v)


def _norm(v: Any) -> Any:
    return [_norm(x) for x in v] if isinstance(v, (list, tuple)) else v


def differences(saved: Mapping[str, Any], now: Mapping[str, Any],
                keys: Iterable[str]) -> list[tuple[str, Any, Any]]:
    """``(field, saved, now)`` for each of ``keys`` whose values differ, in that order.

    Lists and tuples compare alike (a checkpoint may turn one into the other); a field
    whose value now is a mapping (a sampler's ``config``) is compared key by key and
    reported as ``field.key``; a saved value that is no mapping counts as an empty one.

    Example:
        >>> differences({"seed": 1, "w": (1, 2), "config": {"b": 4}}, {"seed": 0, "w": [1, 2],
        ...             "config": {"b": 8, "c": 1}}, ["seed", "w", "config"])
        [('seed', 1, 0), ('config.b', 4, 8), ('config.c', None, 1)]
    """
    out: list[tuple[str, Any, Any]] = []
    for k in keys:
        a, b = saved.get(k), now.get(k)
        if isinstance(b, Mapping):
            a = a if isinstance(a, Mapping) else {}
            subs = list(b) + [s for s in a if s not in b]
            out += [(f"{k}.{s}", a.get(s), b.get(s)) for s in subs if _norm(a.get(s)) != _norm(b.get(s))]
        elif _norm(a) != _norm(b):
            out.append((k, _norm(a), _norm(b)))
    return out


def _words(n: Sequence[int]) -> str:
    text = [str(v) for v in n]
    return text[0] if len(text) == 1 else ", ".join(text[:-1]) + " and " + text[-1]


@dataclass(frozen=True)
class Stages:
    """The rows of a ``stages`` field: ``columns`` are ``(name, rule)`` (:data:`Rule`), the
    count consumed at that shape last.

    Example:
        >>> s = Stages((("world_size", 1), ("mode", ("pad", "drop")), ("batches", 0)))
        >>> s.read([[2, "pad", 3]], what="toy state", fix="pass Toy.state_dict()")
        ((2, 'pad', 3),)
        >>> s.describe((2, "pad", 3))
        "world_size=2, mode='pad'"
        >>> s.read([[2, "up", 3]], what="toy state", fix="pass Toy.state_dict()")
        Traceback (most recent call last):
        ...
        fastfeed.errors.StateError: toy state: stage 0 has mode='up', not one of 'pad', 'drop'; pass Toy.state_dict()
    """

    columns: tuple[tuple[str, Rule], ...]

    @property
    def names(self) -> tuple[str, ...]:
        """The column names, the count's last."""
        return tuple(name for name, _ in self.columns)

    def read(self, raw: Any, *, what: str, fix: str) -> tuple[tuple[Any, ...], ...]:
        """The rows of ``raw`` (a non-empty list of rows), each column checked by its rule.

        Raises:
            StateError: naming the stage, the column, its value and ``fix``.
        """
        shape = f"[{', '.join(self.names)}]"
        if not isinstance(raw, (list, tuple)) or not raw:
            raise StateError(f"{what}: stages={raw!r} is not a list of {shape}, one per shape the epoch ran "
                             f"at (at least one); {fix}")
        rows = []
        for i, row in enumerate(raw):
            if not isinstance(row, (list, tuple)) or len(row) != len(self.columns):
                raise StateError(f"{what}: stage {i} is {row!r}, not {shape}; {fix}")
            rows.append(tuple(self._cell(i, name, rule, v, what, fix) for (name, rule), v in zip(self.columns, row)))
        return tuple(rows)

    @staticmethod
    def _cell(i: int, name: str, rule: Rule, v: Any, what: str, fix: str) -> Any:
        if isinstance(rule, tuple):
            if not isinstance(v, str) or v not in rule:
                raise StateError(f"{what}: stage {i} has {name}={v!r}, not one of "
                                 f"{', '.join(map(repr, rule))}; {fix}")
            return v
        if not _whole(v) or v < rule:
            raise _int_error(f"{what}: stage {i} has {name}={v!r}, not", v, rule, fix)
        return int(v)

    def write(self, rows: Iterable[Sequence[Any]]) -> list[list[Any]]:
        """``rows`` as plain lists of ints and strings, for a checkpoint."""
        return [[v if isinstance(rule, tuple) else int(v) for (_, rule), v in zip(self.columns, row)]
                for row in rows]

    def describe(self, row: Sequence[Any]) -> str:
        """The shape of a row for messages: its columns but the count."""
        return ", ".join(f"{name}={v!r}" for name, v in zip(self.names[:-1], row[:-1]))


@dataclass(frozen=True)
class StateLayout:
    """One versioned state layout: its version field, required fields, integers and stages.

    Args:
        what: how messages name the state (``"loader state"``).
        version_key: the field that holds the version (``"fastfeed_loader"``, ``"version"``).
        version: the version written.
        source: where a good state comes from (``"Loader.state_dict()"``), for the fixes.
        reads: the versions read.
        required: fields every version holds (with ``stages``, that field too from
            ``stages_since`` on); an owner may add the fields of its own state (:meth:`check`).
        ints: fields that are integers >= 0 where present.
        most: ``(field, bound)``: the largest value of some of ``ints`` (``epoch``: :data:`MAX_EPOCH`).
        stages: the rows of ``stages``, or None for a layout without them.
        count_key: the field the last stage's count equals (``"batches"``, ``"step"``).
        stages_since: the first version with ``stages``.
        v1_stage: the one stage row of a state of an older version, from its fields.
        mismatch: one difference in :meth:`check_match`, from ``key``, ``saved`` and ``now``.

    Example:
        >>> TOY = StateLayout("toy state", version_key="toy", version=2, source="Toy.state_dict()")
        >>> TOY.check({"toy": 1}), TOY.fix
        (1, 'pass the dict from Toy.state_dict()')
    """

    what: str
    version_key: str
    version: int
    source: str
    reads: tuple[int, ...] = (1, 2)
    required: tuple[str, ...] = ()
    ints: tuple[str, ...] = ()
    most: tuple[tuple[str, int], ...] = ()
    stages: Stages | None = None
    count_key: str = ""
    stages_since: int = 2
    v1_stage: Callable[[Mapping[str, Any]], Sequence[Any]] | None = None
    mismatch: str = "{key}: saved {saved}, now {now}"

    def __post_init__(self) -> None:
        if self.version not in self.reads:
            raise ValueError(f"{self.what}: version {self.version} must be one of reads={self.reads}")
        if self.stages is not None and (not self.count_key or (self.v1_stage is None and
                                                               min(self.reads) < self.stages_since)):
            raise ValueError(f"{self.what}: a layout with stages needs count_key, and v1_stage to read "
                             f"versions before {self.stages_since}")

    @property
    def fix(self) -> str:
        """The usual fix: the dict from :attr:`source`."""
        return f"pass the dict from {self.source}"

    def error(self, text: str) -> StateError:
        """``StateError("<what>: <text>; <fix>")``."""
        return StateError(f"{self.what}: {text}; {self.fix}")

    def version_of(self, state: Any) -> int:
        """The version of ``state``, one of :attr:`reads`.

        Raises:
            StateError: not a mapping, no version, or a version not read here.
        """
        if not isinstance(state, Mapping):
            raise StateError(f"{self.what}: load_state_dict() takes the dict from {self.source}, "
                             f"not a {type(state).__name__}")
        if self.version_key not in state:
            raise StateError(f"{self.what} lacks {self.version_key} (its version); {self.fix}")
        v = state[self.version_key]
        if _whole(v) and v in self.reads:
            return int(v)
        text = f"{self.what} version {v!r}, this fastfeed reads {_words(self.reads)}"
        if _whole(v) and v > max(self.reads):
            raise StateError(f"{text}: a newer fastfeed saved it; upgrade fastfeed to resume from it")
        raise StateError(f"{text}; {self.fix}")

    def check(self, state: Any, now: Iterable[str] = ()) -> int:
        """Check the version, the required fields and the integers; return the version.

        Args:
            state: the state to check.
            now: more fields the state must hold: those the reading object writes at the
                state's version (a mapping's keys, or names).

        Raises:
            StateError: the message names every missing field, or the first bad integer.
        """
        need = set(self.required) | set(now) | {self.version_key}
        if isinstance(state, Mapping) and self.version_key not in state:  # say all that is missing
            missing = sorted(need - set(state) - {"stages"})  # a version-1 state had none
            if self.version_key != "version":
                missing[missing.index(self.version_key)] += " (its version)"
            raise StateError(f"{self.what} lacks {', '.join(missing)}; {self.fix}")
        version = self.version_of(state)
        if self.stages is not None and version >= self.stages_since:
            need.add("stages")
        else:
            need.discard("stages")
        missing = sorted(need - set(state))
        if missing:
            raise StateError(f"{self.what} lacks {', '.join(missing)}; {self.fix}")
        bounds = dict(self.most)
        for key in self.ints:
            if key in state:
                read_int(state, key, what=self.what, fix=self.fix, most=bounds.get(key))
        return version

    def _stages(self) -> Stages:
        if self.stages is None:
            raise TypeError(f"{self.what}: a layout without stages reads and writes none")
        return self.stages

    def read_stages(self, state: Mapping[str, Any], version: int) -> tuple[tuple[Any, ...], ...]:
        """The stage rows of a checked state (an older version's: its one stage,
        :attr:`v1_stage`); the last row's count is the state's :attr:`count_key`.

        Raises:
            StateError: a malformed row, or a last count that is not the position.
        """
        stages = self._stages()
        if version < self.stages_since and self.v1_stage is not None:  # __post_init__: not None then
            raw: Any = [list(self.v1_stage(state))]
        else:
            raw = state["stages"]
        rows = stages.read(raw, what=self.what, fix=self.fix)
        count = state[self.count_key]
        if rows[-1][-1] != count:
            raise self.error(f"{self.count_key}={count!r} but its last stage says {rows[-1][-1]}")
        return rows

    def write_stages(self, prior: Iterable[Sequence[Any]], current: Sequence[Any]) -> list[list[Any]]:
        """The ``stages`` field: the earlier stages of the epoch, then the current one."""
        return self._stages().write([*prior, current])

    def check_within(self, rows: Sequence[Sequence[Any]], capacity: Callable[[int], int], *, epoch: int) -> None:
        """Each stage consumed at most what it had: ``capacity(i)``, the count the epoch's
        rest held at stage ``i``'s shape after the stages before it.

        Raises:
            StateError: naming the stage, its shape, the counts and the fix.
        """
        stages = self._stages()
        unit = stages.names[-1]
        for i, row in enumerate(rows):
            n = capacity(i)
            if row[-1] > n:
                raise self.error(f"stage {i} ({stages.describe(row)}) consumed {row[-1]} {unit} of {n}, past the "
                                 f"end of epoch {epoch} at that shape")

    def check_match(self, state: Mapping[str, Any], now: Mapping[str, Any], keys: Iterable[str], *,
                    owner: str, fix: str) -> None:
        """The fields ``keys`` equal in ``state`` and ``now`` (see :func:`differences`).

        Args:
            state, now: the saved state and the reading object's own.
            keys: the fields the order depends on, in the order they are reported.
            owner: what reads the state, for the message (``"loader"``).
            fix: what to resume with instead.

        Raises:
            StateError: naming every difference (:attr:`mismatch`), then ``fix``.

        Example:
            >>> TOY = StateLayout("toy state", version_key="toy", version=2, source="Toy.state_dict()")
            >>> TOY.check_match({"seed": 1}, {"seed": 0}, ["seed"], owner="toy", fix="Use seed 1.")
            Traceback (most recent call last):
            ...
            fastfeed.errors.StateError: toy state does not fit this toy (seed: saved 1, now 0). Use seed 1.
        """
        diffs = [self.mismatch.format(key=k, saved=repr(a), now=repr(b)) for k, a, b in differences(state, now, keys)]
        if diffs:
            raise StateError(f"{self.what} does not fit this {owner} ({'; '.join(diffs)}). {fix}")
