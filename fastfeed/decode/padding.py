"""Padded batches: a collate for a ``tokens`` field, or any field of ragged arrays.

The padding rule is :func:`fastfeed.decode.collate.pad_ragged` (the one ``loader()``
runs on token data); this module only names the field and the outputs, for a
DataLoader of your own. :class:`PadCollate` pads one field along its first axis to the longest sample of the
batch (rounded up to a multiple of ``pad_multiple``, capped by ``max_length`` with
truncation) and collates every other field by :func:`~fastfeed.decode.collate.collate`:

- ``input_ids`` (the name is ``name=``): ``(B, T)``; int64 for integer fields (token
  ids), the field's dtype otherwise (e.g. ``(B, T, 80)`` float32 features);
- ``attention_mask``: ``(B, T)`` int64, 1 on real positions, 0 on padding (what HF models take);
- ``lengths``: ``(B,)`` int64, each sample's length after truncation.

The field may be named with or without its extension (``tokens`` finds ``tokens.npy``)
and may hold arrays (``.npy``) or lists of numbers (``.json``). The pad value is
``pad_id``; pass the pad id the index recorded at pack time (``pack --tokenizer``), else
it is 0. A ``PadCollate`` is a small frozen object, so DataLoader workers can pickle it.

Example:
    >>> import numpy as np
    >>> pad = PadCollate(pad_id=0, pad_multiple=4)
    >>> b = pad([{"__key__": "a", "tokens.npy": np.array([5, 6, 7])},
    ...          {"__key__": "b", "tokens.npy": np.array([8])}])
    >>> b["input_ids"].tolist(), b["attention_mask"].tolist(), b["__key__"]
    ([[5, 6, 7, 0], [8, 0, 0, 0]], [[1, 1, 1, 0], [1, 0, 0, 0]], ['a', 'b'])
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from fastfeed.decode.collate import Padding, collate, mask_of, pad_ragged
from fastfeed.errors import ConfigError

__all__ = ["PadCollate", "pad_collate"]


@dataclass(frozen=True)
class PadCollate:
    """Collate samples with ``field`` padded (see the module docstring); call it on a list of samples.

    Attributes:
        field: the ragged field (``tokens`` or ``tokens.npy``, ``feats.npy``, ...).
        pad_id: the pad value (None: 0).
        pad_multiple: round the padded length up to a multiple of this (1: no rounding).
        max_length: truncate longer samples to this many positions (None: no truncation).
        name: the output name of the padded field.
        mask_name: the output name of the mask.
    """

    field: str = "tokens"
    pad_id: int | float | None = None
    pad_multiple: int = 1
    max_length: int | None = None
    name: str = "input_ids"
    mask_name: str = "attention_mask"
    _padding: Padding = dc_field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        pad_id = 0 if self.pad_id is None else self.pad_id
        object.__setattr__(self, "_padding", Padding(pad_id, self.pad_multiple, self.max_length))  # validates
        if self.name == self.mask_name:
            raise ConfigError(f"name and mask_name are both {self.name!r}; pick two names")

    def _key(self, sample: Mapping[str, Any]) -> str:
        if self.field in sample:
            return self.field
        for ext in ("npy", "json"):
            if f"{self.field}.{ext}" in sample:
                return f"{self.field}.{ext}"
        fields = ", ".join(sorted(k for k in sample if not k.startswith("__")))
        raise ConfigError(f"PadCollate(field={self.field!r}): sample {sample.get('__key__', '')!r} has no "
                          f"such field (fields: {fields or 'none'}); pass field= one of them")

    def _array(self, sample: Mapping[str, Any], key: str) -> np.ndarray:
        value = sample[key]
        arr = value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        if arr.ndim == 0 or arr.dtype.kind not in "biuf":
            raise ConfigError(f"PadCollate(field={key!r}): sample {sample.get('__key__', '')!r} holds "
                              f"{type(value).__name__} of dtype {arr.dtype}, shape {arr.shape}; the field must "
                              "hold a sequence of numbers (tokens) or an array with the ragged axis first")
        return arr

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if not samples:
            raise ConfigError("PadCollate: an empty batch")
        key = self._key(samples[0])
        arrays = [self._array(s, self._key(s)) for s in samples]
        tails = {a.shape[1:] for a in arrays}
        if len(tails) > 1:
            raise ConfigError(f"PadCollate(field={key!r}): samples differ beyond the first axis "
                              f"{sorted(tails)[:4]}; only the first axis may be ragged")
        out, lengths = pad_ragged(arrays, self._padding, self._padding.pad_id)
        mask = mask_of(lengths, out.shape[1])
        rest = collate([{k: v for k, v in s.items() if k != self._key(s)} for s in samples])
        rest.update({self.name: torch.from_numpy(out), self.mask_name: torch.from_numpy(mask),
                     "lengths": torch.from_numpy(lengths)})
        return rest


def pad_collate(samples: Sequence[Mapping[str, Any]], *, field: str = "tokens", pad_id: int | float | None = None,
                pad_multiple: int = 1, max_length: int | None = None) -> dict[str, Any]:
    """Functional form of :class:`PadCollate` (one call).

    Example:
        >>> b = pad_collate([{"tokens.npy": np.array([1, 2])}, {"tokens.npy": np.array([3])}], pad_id=9)
        >>> b["input_ids"].tolist(), b["lengths"].tolist()
        ([[1, 2], [3, 9]], [2, 1])
    """
    return PadCollate(field, pad_id, pad_multiple, max_length)(samples)
