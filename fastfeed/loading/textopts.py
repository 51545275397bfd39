"""The text options of ``loader()``: ``seq_len``, ``batch_sampler`` and :class:`~fastfeed.loading.options.Tokens`.

Validated once by :func:`text_settings` (called from
:func:`fastfeed.loading.options.loader_options`), kept apart from the image and DALI
options so each reads on its own:

- ``seq_len=L``: sequence packing (:mod:`fastfeed.loading.cpu.tokens`): rows of exactly
  ``L`` tokens cut from the epoch's documents laid end to end. Not with ``decode="dali"``
  (token data has nothing for DALI to decode), a ``transform`` (the rows are made of
  stored token ids, not of samples), ``on_error="skip"`` (a left-out document would
  shift every later token of the plan) or a ``batch_sampler``.
- ``tokens=Tokens(pad_id=, pad_multiple=)``: padded batches of a ``tokens`` field or of ragged
  arrays a ``transform`` returns (:func:`fastfeed.decode.collate.collate`). ``pad_id``
  None is resolved against the dataset (the pad id ``pack --tokenizer`` stored, else 0).
- ``batch_sampler``: a :class:`~fastfeed.sampling.samplers.DistributedTokenBudgetSampler`,
  :class:`~fastfeed.sampling.samplers.DistributedLengthBucketSampler` or
  :class:`~fastfeed.sampling.aspect.DistributedAspectRatioSampler` that decides
  every batch (:mod:`fastfeed.loading.cpu.sampled`). An aspect-ratio sampler's buckets set
  each batch's image size (no ``image_size``), and it is the one ``decode="dali"`` takes. It owns the order, so ``shuffle``,
  ``seed``, ``drop_last`` and ``order=Order(shuffle_block=)`` go to the sampler, and ``batch_size``
  comes from it (a length-bucket sampler's ``batch_size``; a token budget's typical
  batch, used only for the worker heuristics). Its world is the loader's world.

Example:
    >>> from types import SimpleNamespace as NS
    >>> text_settings({"seq_len": 8, "decode": "cpu", "transform": None, "on_error": "raise",
    ...                "tokens": NS(pad_id=None, pad_multiple=1), "batch_sampler": None, "batch_size": 4})
    {'seq_len': 8}
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fastfeed.decode.cpu import CoverDecoder, CpuDecoder
from fastfeed.errors import ConfigError
from fastfeed.loading.order.epoch import DEFAULT_SHUFFLE_BLOCK
from fastfeed.sampling.aspect import DistributedAspectRatioSampler
from fastfeed.sampling.samplers import (
    DistributedLengthBucketSampler,
    DistributedTokenBudgetSampler,
)

__all__ = ["SAMPLERS", "cover_decoder", "is_aspect", "max_batch", "text_settings", "typical_batch"]

#: The samplers ``loader(batch_sampler=)`` takes.
SAMPLERS = (DistributedTokenBudgetSampler, DistributedLengthBucketSampler, DistributedAspectRatioSampler)
#: The order options a batch sampler owns, with the values that leave it to the sampler.
_ORDER = {"shuffle": True, "seed": 0, "drop_last": False, "shuffle_block": DEFAULT_SHUFFLE_BLOCK}


def _order_values(args: Mapping[str, Any]) -> dict[str, Any]:
    order = args.get("order")
    return {"shuffle": args.get("shuffle", True), "seed": args.get("seed", 0), "drop_last": args.get("drop_last", False),
            "shuffle_block": getattr(order, "shuffle_block", DEFAULT_SHUFFLE_BLOCK)}


def _positive(name: str, value: Any, *, allow_none: bool) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r} must be an integer >= 1" + (" (or None)" if allow_none else ""))
    return value


def text_settings(args: Mapping[str, Any]) -> dict[str, Any]:
    """The checked text options of ``args`` (``loader()``'s arguments with defaults filled in).

    Returns ``seq_len``, and with a ``batch_sampler`` also ``batch_sampler``,
    ``batch_size``, ``rank`` and ``world_size`` taken from it. ``args["tokens"]`` is the
    checked :class:`~fastfeed.loading.options.Tokens` group.

    Raises:
        ConfigError: a value out of range, or a combination that cannot work (the message
            says which option to drop).
    """
    seq_len = _positive("seq_len", args.get("seq_len"), allow_none=True)
    out: dict[str, Any] = {"seq_len": seq_len}
    sampler = args.get("batch_sampler")
    tokens = args["tokens"]
    if args.get("decode") == "dali":
        values = {"seq_len": seq_len, "batch_sampler": None if is_aspect(sampler) else sampler,
                  "pad_id": tokens.pad_id,
                  "pad_multiple": tokens.pad_multiple}
        given = [f"{k}={values[k]!r}" for k, neutral in (("seq_len", None), ("batch_sampler", None), ("pad_id", None),
                                                         ("pad_multiple", 1)) if values[k] != neutral]
        if given:
            raise ConfigError(f"decode='dali' decodes images; {', '.join(given)} load or pad token data, which "
                              "needs no decoding: use decode='cpu' (the default) with them")
    if seq_len is not None:
        _check_seq_len(args, sampler)
    if sampler is not None:
        out.update(_sampler_settings(args, sampler))
    return out


def _check_seq_len(args: Mapping[str, Any], sampler: Any) -> None:
    if sampler is not None:
        raise ConfigError("seq_len= packs rows of exactly seq_len tokens, so every batch has the same "
                          "shape; a batch_sampler= picks batches of whole samples instead; use one of them")
    if args.get("transform") is not None:
        raise ConfigError("seq_len= builds rows from the stored token ids, so a per-sample transform "
                          "cannot apply; tokenize at pack time (fastfeed pack --tokenizer ... --tokenize FIELD) "
                          "or drop seq_len= to get padded batches of the transform's arrays")
    if args.get("on_error") == "skip":
        raise ConfigError("seq_len= lays documents end to end by their recorded lengths, so a skipped "
                          "document would shift every later token; use on_error='raise' (the default)")


def _sampler_settings(args: Mapping[str, Any], sampler: Any) -> dict[str, Any]:
    if not isinstance(sampler, SAMPLERS):
        raise ConfigError(
            f"batch_sampler={type(sampler).__name__}: loader() takes a DistributedTokenBudgetSampler, "
            "a DistributedLengthBucketSampler or a DistributedAspectRatioSampler (fastfeed.sampling); for another "
            "sampler use "
            "fastfeed.open_dataset() with a torch DataLoader")
    values = _order_values(args)
    given = [k for k, default in _ORDER.items() if values[k] != default]
    if given:
        raise ConfigError(
            f"{', '.join(f'{k}={values[k]!r}' for k in given)}: with batch_sampler= the sampler decides the "
            "order; pass shuffle/seed/drop_last to the sampler and drop them here")
    name = type(sampler).__name__
    batch_size = args.get("batch_size")
    if is_aspect(sampler) and args.get("image_size") is not None:
        raise ConfigError(f"image_size={args['image_size']!r}: with a {name} each batch takes its bucket's "
                          "(height, width); drop image_size= (the sampler's resolution= or buckets= set the sizes)")
    if isinstance(sampler, DistributedLengthBucketSampler) or (is_aspect(sampler) and sampler.batch_size is not None):
        if batch_size is not None and batch_size != sampler.batch_size:
            raise ConfigError(f"batch_size={batch_size!r} but the {name} makes batches of "
                              f"{sampler.batch_size}; drop batch_size= (it comes from the sampler)")
        batch_size = sampler.batch_size
    else:
        if batch_size is not None:
            budget = f"max_pixels={sampler.max_pixels}" if getattr(sampler, "max_pixels", None) is not None \
                else f"max_cost={sampler.max_cost:g}"
            raise ConfigError(f"batch_size={batch_size!r}: a {name} sizes every batch to fit {budget}; "
                              "drop batch_size=")
        batch_size = typical_batch(sampler)
    world = {"rank": sampler.rank, "world_size": sampler.num_replicas}
    for k, v in world.items():
        if args.get(k) is not None and args[k] != v:
            raise ConfigError(f"{k}={args[k]!r} but the batch_sampler was built for {k}={v}; build the "
                              f"sampler with the loader's world (num_replicas=, rank=) or drop {k}=")
    return {"batch_sampler": sampler, "batch_size": batch_size, **world}


def is_aspect(sampler: Any) -> bool:
    """The sampler is a :class:`~fastfeed.sampling.aspect.DistributedAspectRatioSampler` (batches of image buckets).

    Example:
        >>> is_aspect(None)
        False
    """
    return isinstance(sampler, DistributedAspectRatioSampler)


def cover_decoder(base: CpuDecoder, sampler: Any, crop: str) -> CoverDecoder:
    """``base`` resizing each image to cover its bucket of the aspect-ratio ``sampler`` and cropping
    it (``crop``: ``Crop(bucket_crop=)``): what ``decode="cpu"`` decodes with, and where
    ``decode="dali"`` takes its crop boxes from, so both crop alike.

    Example:
        >>> s = DistributedAspectRatioSampler([[300, 400]], resolution=64, batch_size=1, num_replicas=1, rank=0)
        >>> (hw, c) = cover_decoder(CpuDecoder(augment=False), s, "random").crops(np.array([0]), 0)
        >>> hw, c.boxes.tolist(), c.top_left.tolist()
        ((64, 64), [[0, 47, 300, 300]], [[0, 10]])
    """
    b = sampler.buckets
    return CoverDecoder(base, shapes=np.stack([b.heights, b.widths], axis=1), bucket_of=sampler.bucket_of,
                        sizes=sampler.sizes, crop=crop)


def max_batch(sampler: Any) -> int:
    """The most images one batch of ``sampler`` holds (what a DALI pipeline's batch size must be).

    Example:
        >>> max_batch(DistributedAspectRatioSampler([[480, 640]] * 5, resolution=64, batch_size=3,
        ...                                         num_replicas=1, rank=0))
        3
    """
    sizes = getattr(sampler, "batch_sizes", None)
    if sizes is None:
        return int(sampler.batch_size)
    used = np.unique(sampler.bucket_of[sampler.bucket_of >= 0])
    return int(np.max(sizes[used])) if used.size else 1


def typical_batch(sampler: Any) -> int:
    """A sampler's mean batch size over epoch 0 (at least 1): what the worker heuristics size for.

    Example:
        >>> s = DistributedTokenBudgetSampler([10] * 12, max_cost=40, num_replicas=1, rank=0)
        >>> typical_batch(s)
        4
    """
    steps = max(1, len(sampler.epoch_plan(0).rank_batches(sampler.rank)[1]) - 1)
    return max(1, round(int(sampler.lengths.shape[0]) / (steps * sampler.num_replicas)))
