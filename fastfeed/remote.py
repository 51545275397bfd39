"""Object storage through fsspec (lazy import): URLs like ``s3://bucket/prefix``.

The loader extends this module with retries, backoff and the local shard cache.
"""

from __future__ import annotations

from typing import Any

from fastfeed.errors import missing_dependency

__all__ = ["exists", "filesystem", "read_bytes"]


def filesystem(url: str) -> tuple[Any, str]:
    """Return (fsspec filesystem, path within it) for ``url``."""
    try:
        import fsspec
    except ImportError:
        raise missing_dependency("fsspec", "s3", "Remote datasets") from None
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path


def read_bytes(url: str) -> bytes:
    """Read a whole object."""
    fs, path = filesystem(url)
    return fs.cat_file(path)


def exists(url: str) -> bool:
    fs, path = filesystem(url)
    return bool(fs.exists(path))
