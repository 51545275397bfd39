"""The one exception tree of fastfeed.

Every error a user can cause says what went wrong, where (the file, shard, key or
argument) and how to fix it::

    FastfeedError
    ├── ConfigError (ValueError)          bad argument or option combination
    ├── SourceError                       a problem with the input of ``pack``
    │   ├── EmptySourceError              nothing to pack
    │   ├── DuplicateKeyError             two files map to one (key, field)
    │   ├── BadFileError                  unreadable, zero-byte, not what its extension says
    │   └── UnsafePathError               ``..``, absolute paths, newlines, symlink loops
    ├── DestinationError                  DST inside SRC, non-empty DST, ...
    │   ├── DiskFullError (OSError)       no space left where pack writes: names the folder, the
    │   │                                 space free and the space still needed
    │   └── DestinationBusyError          another pack writes into DST: names its pid, host and start
    ├── IndexVersionError                 an index written by another format version
    ├── IndexMismatchError                the index does not match its shards
    ├── ShardError                        a missing, truncated or corrupt shard
    │   └── SampleError                   one sample cannot be read or decoded
    ├── StateError (ValueError)           a state_dict that does not fit this loader/sampler
    ├── RemoteError                       object storage failed after retries
    ├── StallError (RuntimeError)         no batch within the watchdog's bound: names the worker,
    │                                     its state and the shard it reads
    └── MissingDependencyError (ImportError)  an optional dependency is not installed

Example:
    >>> from fastfeed.errors import FastfeedError, ConfigError
    >>> issubclass(ConfigError, ValueError) and issubclass(ConfigError, FastfeedError)
    True
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BadFileError",
    "ConfigError",
    "DestinationBusyError",
    "DestinationError",
    "DiskFullError",
    "DuplicateKeyError",
    "EmptySourceError",
    "FastfeedError",
    "IndexMismatchError",
    "IndexVersionError",
    "MissingDependencyError",
    "RemoteError",
    "SampleError",
    "ShardError",
    "SourceError",
    "StallError",
    "StateError",
    "UnsafePathError",
    "missing_dependency",
]


class FastfeedError(Exception):
    """Base class of every error fastfeed raises on purpose."""


class ConfigError(FastfeedError, ValueError):
    """An argument or a combination of options is invalid."""


class SourceError(FastfeedError):
    """The input of ``pack`` has a problem."""


class EmptySourceError(SourceError):
    """The source holds nothing to pack."""


class DuplicateKeyError(SourceError):
    """Two files map to the same sample key and field."""


class BadFileError(SourceError):
    """A file is unreadable, empty, or not what its extension says."""


class UnsafePathError(SourceError):
    """A path that cannot be stored safely (``..``, absolute, newline, symlink loop)."""


class DestinationError(FastfeedError):
    """The destination of ``pack`` cannot be used as asked."""


class DiskFullError(DestinationError, OSError):
    """No space left (``ENOSPC``, or a quota: ``EDQUOT``) where ``pack`` writes.

    An OSError too, with the errno of the failed write, so code that caught the OSError
    keeps working.

    Attributes:
        path: the folder the write failed in.
        free: bytes free there when it failed (None when unknown).
        needed: bytes still to write, estimated from the plan (None when unknown).
    """

    def __init__(self, message: str, *, path: str = "", free: int | None = None, needed: int | None = None,
                 errno: int = 28) -> None:
        super().__init__(message)
        self.errno = errno
        self.strerror = message
        self.filename = path or None
        self.path = path
        self.free = free
        self.needed = needed

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self) -> Any:  # pack's writer processes send it to the pack process
        return _rebuild, (type(self), str(self), {"path": self.path, "free": self.free, "needed": self.needed,
                                                  "errno": self.errno})


class DestinationBusyError(DestinationError):
    """Another ``pack`` is writing into the destination (its lock is held).

    Attributes:
        holder: what the other writer recorded: ``pid``, ``host``, ``started``, ``command``
            (empty when it had not written them yet).
    """

    def __init__(self, message: str, *, holder: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.holder = dict(holder or {})

    def __reduce__(self) -> Any:
        return _rebuild, (type(self), str(self), {"holder": self.holder})


def _rebuild(cls: type[FastfeedError], message: str, attrs: dict[str, Any]) -> FastfeedError:
    """Unpickle an error that takes keyword attributes (see the classes' ``__reduce__``)."""
    return cls(message, **attrs)  # type: ignore[call-arg]


class IndexVersionError(FastfeedError):
    """The index was written by an incompatible format version."""


class IndexMismatchError(FastfeedError):
    """The index does not describe the shards next to it."""


class ShardError(FastfeedError):
    """A shard is missing, truncated or corrupt."""


class SampleError(ShardError):
    """One sample cannot be read or decoded.

    Attributes:
        shard: the shard's file name or URL.
        key: the sample key, when known.
        offset: the byte offset (tar) or record number (LMDB), when known.
    """

    def __init__(
        self, message: str, *, shard: str = "", key: str = "", offset: int | None = None
    ) -> None:
        super().__init__(message)
        self.shard = shard
        self.key = key
        self.offset = offset


class StateError(FastfeedError, ValueError):
    """A saved state does not fit the object it is loaded into."""


class RemoteError(FastfeedError):
    """Object storage failed after retries."""


class StallError(FastfeedError, RuntimeError):
    """No batch came within ``Workers(stall_timeout=)`` and ``on_stall="raise"`` was asked for.

    A RuntimeError, as PyTorch's own ``DataLoader timed out`` is, so code that caught that
    keeps working.

    Attributes:
        worker: the DataLoader worker that holds the loop up (None: not a worker, e.g. the
            DALI pipeline, or none could be named).
        pid: its process id (None when unknown).
        state: what it is doing, in words (``"stopped (state T)"``, ``"in disk wait (state D)"``,
            ``"reading"``, ...).
        shard: the shard it is reading, when known.
        waited: seconds the loop waited.
    """

    def __init__(self, message: str, *, worker: int | None = None, pid: int | None = None, state: str = "",
                 shard: str = "", waited: float = 0.0) -> None:
        super().__init__(message)
        self.worker = worker
        self.pid = pid
        self.state = state
        self.shard = shard
        self.waited = waited


class MissingDependencyError(FastfeedError, ImportError):
    """An optional dependency is not installed."""


def missing_dependency(module: str, extra: str, purpose: str) -> MissingDependencyError:
    """Build the error for a missing optional dependency, with the install lines.

    Both lines work where fastfeed was installed from its clone (README.md's ``pip install .``;
    fastfeed is on no package index): ``pip install 'fastfeed[EXTRA]'`` takes the installed
    fastfeed and adds the extra's packages, ``pip install '.[EXTRA]'`` runs in the clone.

    Example:
        >>> print(missing_dependency("tokenizers", "text", "--tokenizer"))
        --tokenizer: the 'tokenizers' module is missing; pip install 'fastfeed[text]' (adds the 'text' extra to the installed fastfeed), or in the fastfeed clone: pip install '.[text]'
    """
    return MissingDependencyError(
        f"{purpose}: the '{module}' module is missing; pip install 'fastfeed[{extra}]' (adds the '{extra}' extra "
        f"to the installed fastfeed), or in the fastfeed clone: pip install '.[{extra}]'"
    )
