"""Every ``fastfeed.loader`` the benchmarks build, through one function.

:func:`fastfeed_loader` is the only place in ``benchmarks/`` that spells the loader's keyword
arguments: :func:`loader_kwargs` names them flat, :func:`grouped` puts them in the loader's
groups (``fastfeed.Workers(prefetch_factor=...)``, ``fastfeed.Dali(num_threads=...)``) through
the loader's own mapping, so a benchmark never meets a former spelling's ``FutureWarning``.
The benchmarks name their settings in their own words (``workers``, ``prefetch``, ``dali``);
settings left out are the loader's defaults, so a benchmark measures what a user gets.

Example:
    >>> dl = fastfeed_loader("/data/ff", batch_size=256, image_size=224, workers=2, prefetch=2)  # doctest: +SKIP
    >>> next(epochs(dl)())["image"].shape                                                       # doctest: +SKIP
    torch.Size([256, 3, 224, 224])
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator, Mapping

__all__ = ["DALI_KNOBS", "epochs", "fastfeed_loader", "fastfeed_options", "grouped", "loader_kwargs", "option_value",
           "shutdown"]

#: the DALI settings a benchmark may pass in ``dali=`` (the loader's own names for them)
DALI_KNOBS = ("num_threads", "hw_decoder_load", "prefetch_queue_depth", "num_pipelines")
_UNSET: Any = object()


def loader_kwargs(
    *, batch_size: int | None = None, image_size: int | None = None, decode: str | None = "cpu",
    workers: int | None = None, prefetch: int | None = None, pin_memory: bool | None = None,
    shuffle: bool | None = None, seed: int | None = None, drop_last: bool | None = None,
    augment: bool | None = None, rank: int | None = None, world_size: int | None = None,
    decode_backend: str | None = None, device_id: int | None = _UNSET, dali: Mapping[str, Any] | Any = None,
    seq_len: int | None = None, pad_multiple: int | None = None, batch_sampler: Any = None,
    cache_dir: str | os.PathLike[str] | None = None, storage_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The keyword arguments of ``fastfeed.loader`` for these settings (the rest left to its defaults).

    Args:
        batch_size, image_size, decode, shuffle, seed, drop_last, augment, rank, world_size,
            seq_len, batch_sampler: as the loader's.
        workers: worker processes (``decode="cpu"``).
        prefetch: batches in flight per worker; None with ``workers=0`` (the loader takes
            none then).
        pin_memory: page-locked batches (for a copy to the GPU).
        decode_backend: the CPU decoder (``"turbo"``, ``"pillow"``).
        device_id: the GPU of ``decode="dali"`` (None: DALI on the CPU).
        dali: DALI's settings, by the names of :data:`DALI_KNOBS`; or a ``fastfeed.Dali`` (the loader's
            own group, passed as it is: ``fastfeed.Dali(device_id=None)`` runs DALI on the CPU).
        pad_multiple: pad token batches to a multiple of this.
        cache_dir, storage_options: where remote shards are cached, how they are reached.

    Returns:
        The keyword arguments.

    Example:
        >>> loader_kwargs(batch_size=64, workers=0, prefetch=2)
        {'batch_size': 64, 'num_workers': 0, 'decode': 'cpu', 'prefetch_factor': None}
    """
    group = None
    if dali is not None and not isinstance(dali, Mapping):  # a fastfeed.Dali
        group, dali = dali, None
    unknown = sorted(set(dali or {}) - set(DALI_KNOBS))
    if unknown:
        raise ValueError(f"dali={dict(dali or {})}: unknown {unknown}; the knobs are {', '.join(DALI_KNOBS)}")
    kw: dict[str, Any] = {"batch_size": batch_size, "image_size": image_size, "shuffle": shuffle, "seed": seed,
                          "drop_last": drop_last, "augment": augment, "rank": rank, "world_size": world_size,
                          "num_workers": workers, "pin_memory": pin_memory, "decode_backend": decode_backend,
                          "seq_len": seq_len, "pad_multiple": pad_multiple, "batch_sampler": batch_sampler,
                          "cache_dir": cache_dir, "storage_options": storage_options, **(dali or {})}
    kw = {k: v for k, v in kw.items() if v is not None}
    kw["decode"] = decode
    if prefetch is not None:
        kw["prefetch_factor"] = prefetch if workers else None  # never with num_workers=0
    if device_id is not _UNSET:
        kw["device_id"] = device_id
    if group is not None:
        kw["dali"] = group
    return kw


def fastfeed_loader(path: str | os.PathLike[str], **settings: Any) -> Any:
    """``fastfeed.loader(path, ...)`` with the settings of :func:`loader_kwargs`."""
    import fastfeed

    return fastfeed.loader(str(path), **grouped(loader_kwargs(**settings)))


def fastfeed_options(**settings: Any) -> Any:
    """The loader's validated options for the settings of :func:`loader_kwargs` (no dataset opened)."""
    from fastfeed.loading.options import loader_options

    return loader_options(**grouped(loader_kwargs(**settings)))


def grouped(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` in the loader's grouped spelling (``prefetch_factor=2`` -> ``workers=fastfeed.Workers(...)``),
    so no benchmark meets the former spellings' FutureWarning.

    Example:
        >>> grouped({"num_workers": 2, "prefetch_factor": 2})
        {'num_workers': 2, 'workers': Workers(prefetch_factor=2)}
    """
    from fastfeed.loading.options import as_keywords

    return as_keywords(kwargs)


def option_value(options: Any, name: str) -> Any:
    """A loader option's value by its flat name (``num_threads``), wherever the loader's options keep
    it: on the options themselves, or in one of their groups (``options.dali.num_threads``).

    Raises:
        AttributeError: when neither has it.
    """
    import dataclasses

    if hasattr(options, name):
        return getattr(options, name)
    for f in dataclasses.fields(options):
        group = getattr(options, f.name)
        if dataclasses.is_dataclass(group) and hasattr(group, name):
            return getattr(group, name)
    raise AttributeError(f"{type(options).__name__} has no option {name!r}, in no group either")


def epochs(dl: Any, first: int = 0) -> Callable[[], Iterator[Any]]:
    """A callable that starts the loader's next epoch each time (``set_epoch``, then ``iter``)."""
    epoch = first

    def one_epoch() -> Iterator[Any]:
        nonlocal epoch
        dl.set_epoch(epoch)
        epoch += 1
        return iter(dl)

    return one_epoch


def shutdown(dl: Any) -> None:
    """Stop a torch DataLoader's persistent workers now (rather than at garbage collection).

    ``DataLoader`` has no public close(); its iterator's shutdown is what its ``__del__`` calls.
    """
    it = getattr(dl, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    dl._iterator = None
