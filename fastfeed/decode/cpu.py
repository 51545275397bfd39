"""``decode="cpu"``: samples -> one batch dict, images decoded in the worker processes.

What a batch holds (``B`` samples):

- ``"image"``: uint8 ``B x 3 x H x W`` (RGB), one tensor filled in place (channels_last
  memory format: a view of the NHWC buffer; ``.contiguous()`` gives plain NCHW).
  With ``image_size``: RandomResizedCrop + horizontal flip when ``augment`` (torchvision's
  defaults ``scale=(0.08, 1)``, ``ratio=(3/4, 4/3)``), else the evaluation crop
  (shorter side to ``size / 0.875``, central crop). Without ``image_size`` the images
  keep their size and must all be the same.
- ``"label"``: int64 ``B`` from the index's labels, else the ``cls`` field; the ``cls``
  field is not repeated. Absent when the data has neither; -1 for a sample without.
  Images stored as pixels (``pack --store raw``, the field ``rgb8``) take the same crop and
  flip straight from the stored pixels, with no decode (:mod:`fastfeed.decode.raw`); a
  dataset that stores some images each way (``--store mixed:P``) mixes both in one batch.
- ``"__key__"``: the list of sample keys, always.
- every other field, decoded by :func:`fastfeed.decode.fields.decode_field` (``.json``
  -> dict, ``.txt`` -> str, ``.cls`` -> int, ``.npy`` -> array, ...; pickles and unknown
  types as raw bytes, never unpickled) as a list.
- with an aspect-ratio sampler (:class:`CoverDecoder`): ``"image"`` at the batch's bucket
  size, and ``"original_size"`` / ``"crop_top_left"`` (int64 ``B x 2`` each).

The random crop and flip of a sample are a function of ``(seed, epoch, sample number)``
(:func:`fastfeed.decode.geometry.uniforms`), so they do not depend on workers or ranks.
With a ``transform``, each sample dict (``"image"`` as an upright HWC uint8 array,
cropped when ``image_size`` is set; ``"label"`` as int; decoded fields) goes through it,
and the results are collated by :func:`fastfeed.decode.collate.collate`.

Example:
    >>> dec = CpuDecoder(image_size=224, seed=0)          # doctest: +SKIP
    >>> batch = dec.decode_batch(samples, ids, epoch=0, labels=None, fail=raise_it)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from fastfeed.decode.collate import INPUT_IDS, Padding, batch_buffer, collate, nhwc_to_nchw
from fastfeed.decode.fields import decode_field
from fastfeed.decode.geometry import (
    FLIP,
    NUM_UNIFORMS,
    center_crop,
    check_crop,
    cover_crops,
    normalize_image_size,
    random_resized_crop,
    uniforms,
)
from fastfeed.decode.image import ImageDecoder
from fastfeed.decode.raw import crop_into, is_pixels, pixels
from fastfeed.errors import ConfigError, SampleError
from fastfeed.formats.naming import PREFERRED_IMAGE_FIELDS as _PREFERRED
from fastfeed.formats.naming import RAW_FIELD, holds_pixels, pick_image_field

# normalize_image_size lives in fastfeed.decode.geometry, pick_image_field in fastfeed.formats.naming;
# importable from here too
__all__ = ["CoverDecoder", "CpuDecoder", "Fail", "RawDecoder", "normalize_image_size", "pick_image_field"]

#: Called with (position in the batch, exception) for a sample that cannot be used;
#: raises (on_error="raise") or returns to drop the sample (on_error="skip").
Fail = Callable[[int, BaseException], None]

_SHAPE = "__shape__"  # (h, w) of a raw image, attached by the reader from the index (shapes.npy)
# What a bad sample raises (the image decoder turns its libraries' errors into SampleError;
# a shard reader may raise OSError)
_BAD_DATA: tuple[type[BaseException], ...] = (SampleError, OSError, ValueError)
_NO_FIELDS: dict[str, Any] = {}


def _label_of(sample: dict[str, Any], label: int | None) -> int | None:
    if label is not None:
        return int(label)
    raw = sample.get("cls")
    return None if raw is None else decode_field("cls", raw)


class RawDecoder:
    """``decode=None``: every field as raw bytes (lists), plus the index's labels if any.

    An image stored as pixels (``rgb8``, ``pack --store raw``) is the exception: it arrives as
    its uint8 ``(h, w, 3)`` array (``ds[i]`` of :func:`fastfeed.open_dataset`), and in a loader's
    batch as a list of them (their sizes differ), which the DataLoader hands over as uint8
    ``(h, w, 3)`` tensors; None for a sample stored as JPEG (``--store mixed:P``). Its byte
    count is checked against the index's shape.

    Example:
        >>> RawDecoder().decode_batch([{"__key__": "a", "txt": b"x"}], np.array([0]), 0,
        ...                           None, None)["txt"]
        [b'x']
    """

    def __init__(self, transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 pad: Padding | None = None) -> None:
        self.transform, self.pad = transform, pad

    def decode_sample(self, sample: dict[str, Any], sid: int, epoch: int, label: int | None) -> dict[str, Any]:
        out = dict(sample)
        shape = out.pop(_SHAPE, None)
        if RAW_FIELD in out:  # a writable copy: torch refuses to wrap read-only arrays silently
            out[RAW_FIELD] = pixels(out[RAW_FIELD], shape).copy()
        if label is not None and label >= 0:
            out["label"] = int(label)
        return self.transform(out) if self.transform is not None else out

    def decode_batch(self, samples: list[dict[str, Any]], ids: np.ndarray, epoch: int,
                     labels: np.ndarray | None, fail: Fail | None) -> dict[str, Any]:
        out = []
        for j, s in enumerate(samples):
            lab = None if labels is None else int(labels[j])
            try:
                out.append(self.decode_sample(s, int(ids[j]), epoch, lab))
            except SampleError as e:
                if fail is None:
                    raise
                fail(j, e)
        if self.transform is None and any(RAW_FIELD in s for s in out):  # arrays of many sizes: a list
            raw = [s.pop(RAW_FIELD, None) for s in out]
            batch = collate(out, self.pad)
            batch[RAW_FIELD] = raw
            return batch
        return collate(out, self.pad)


class CpuDecoder:
    """Decode, crop and collate samples on the CPU (see the module docstring).

    Args:
        image_size: output ``int`` or ``(h, w)``; None keeps the decoded size.
        augment: RandomResizedCrop + flip (True) or the evaluation center crop (False).
        seed: the loader's seed (crops depend on seed, epoch and sample number).
        backend: ``"auto"``, ``"turbo"`` or ``"pillow"`` (:mod:`fastfeed.decode.image`).
        image_field: the field to decode as ``"image"``; None picks one per sample
            (:func:`pick_image_field`).
        transform: called on every sample dict before collation.
        scale: RandomResizedCrop area range.
        ratio: RandomResizedCrop aspect-ratio range.
        flip: random horizontal flip when augmenting.
        crop_fraction: evaluation crop as a fraction of the shorter side.
        pad: pad ragged arrays (token data) in the collate (:class:`~fastfeed.decode.collate.Padding`).
        tokens_field: a field of token ids (``tokens.npy``) delivered as ``"input_ids"``.
    """

    def __init__(
        self,
        *,
        image_size: int | Sequence[int] | None = None,
        augment: bool = True,
        seed: int = 0,
        backend: str = "auto",
        image_field: str | None = None,
        transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip: bool = True,
        crop_fraction: float = 0.875,
        pad: Padding | None = None,
        tokens_field: str | None = None,
    ) -> None:
        self.pad, self.tokens_field = pad, tokens_field
        self.image_size = normalize_image_size(image_size)
        self.scale, self.ratio, self.crop_fraction = check_crop(scale, ratio, crop_fraction)
        self.augment, self.seed, self.flip = bool(augment), int(seed), bool(flip)
        self.image_field, self.transform = image_field, transform
        self.images = ImageDecoder(backend)

    # ------------------------------------------------------------------ pieces
    def _field(self, sample: dict[str, Any]) -> str:
        f = self.image_field
        if f is not None:
            if f not in sample:
                have = ", ".join(sorted(k for k in sample if not k.startswith("__")))
                raise SampleError(f"no field '{f}' (image_field=) in this sample; it has {have}")
            return f
        found = pick_image_field([k for k in sample if not k.startswith("__")])
        if found is None:
            raise SampleError(f"no image field ({'/'.join(_PREFERRED)}, ...) in this sample; "
                              "pass image_field= or decode=None")
        return found

    def _box(self, u: np.ndarray | list[float] | None) -> Callable[[int, int], tuple[int, int, int, int]]:
        out_h, out_w = self.image_size  # type: ignore[misc]
        if u is None:
            return lambda h, w: center_crop(h, w, out_h, out_w, self.crop_fraction)
        return lambda h, w: random_resized_crop(h, w, u, self.scale, self.ratio)  # type: ignore[arg-type]

    @staticmethod
    def _other_fields(sample: dict[str, Any], image: str | None) -> dict[str, Any]:
        """Decoded fields other than the image and ``cls`` (which is the label)."""
        return {
            k: decode_field(k, v) for k, v in sample.items()
            if not k.startswith("__") and k != image and k != "cls"
        }

    def _uniforms(self, ids: np.ndarray, epoch: int) -> np.ndarray | None:
        if not (self.augment and self.image_size is not None):
            return None
        return uniforms(seed=self.seed, epoch=epoch, ids=ids, n=NUM_UNIFORMS)

    # ------------------------------------------------------------------ one sample
    def decode_sample(self, sample: dict[str, Any], sid: int, epoch: int, label: int | None) -> dict[str, Any]:
        """One sample dict, decoded (image as HWC uint8, upright, cropped if sized); then transform."""
        u = self._uniforms(np.array([sid]), epoch)
        out: dict[str, Any] = {"__key__": sample.get("__key__", "")}
        field = None
        if any(holds_pixels(k) for k in sample if not k.startswith("__")):
            field = self._field(sample)
            data = sample[field]
            if field == RAW_FIELD:
                data = pixels(data, sample.get(_SHAPE))
            out["image"] = self._decode_one(data, None if u is None else u[0])
        lab = _label_of(sample, label)
        if lab is not None:
            out["label"] = lab
        out.update(self._other_fields(sample, field))
        if self.tokens_field is not None and self.tokens_field in out:
            out[INPUT_IDS] = out.pop(self.tokens_field)
        return self.transform(out) if self.transform is not None else out

    def _decode_one(self, data: bytes | np.ndarray, u: np.ndarray | None) -> np.ndarray:
        """An image file's bytes, or raw pixels (an array), as the HWC ``"image"``."""
        raw = is_pixels(data)
        if self.image_size is None:
            return data.copy() if raw else self.images.decode(data)
        dst = np.empty((*self.image_size, 3), dtype=np.uint8)
        flip = u is not None and self.flip and u[FLIP] < 0.5
        if raw:
            crop_into(data, dst, self._box(u), flip=bool(flip))
        else:
            self.images.decode_into(data, dst, self._box(u), flip=bool(flip))
        return dst

    # ------------------------------------------------------------------ a batch
    def decode_batch(self, samples: list[dict[str, Any]], ids: np.ndarray, epoch: int,
                     labels: np.ndarray | None, fail: Fail | None) -> dict[str, Any]:
        """Decode and collate a batch; samples that fail go to ``fail`` (None: raise)."""
        if self.transform is not None or self.image_size is None or self.tokens_field is not None:
            return self._batch_generic(samples, ids, epoch, labels, fail)
        out_h, out_w = self.image_size
        buf, arr = batch_buffer((len(samples), out_h, out_w, 3))
        u = self._uniforms(ids, epoch)
        # per-batch, not per-sample: plain Python floats/bools/ints (numpy scalars are slow
        # in the per-sample arithmetic), and the field layout worked out once per layout
        rows: list[Any] = [None] * len(samples) if u is None else u.tolist()
        flips = [False] * len(samples) if u is None or not self.flip else (u[:, FLIP] < 0.5).tolist()
        given = None if labels is None else labels.tolist()
        decode_into, box_of = self.images.decode_into, self._box
        keys: list[str] = []
        labs: list[int] = []
        others: list[dict[str, Any]] = []
        has_label = labels is not None
        layout: Any = None
        field, plain = "", False
        for j, s in enumerate(samples):
            try:
                if s.keys() != layout:
                    layout = s.keys()
                    field = self._field(s)
                    # nothing to decode besides the image and the label: skip the per-sample dict
                    plain = all(k.startswith("__") or k == field or k == "cls" for k in layout)
                lab = _label_of(s, None if given is None else given[j])
                fields = _NO_FIELDS if plain else self._other_fields(s, field)
                if field == RAW_FIELD:  # stored pixels: crop a view, no decode
                    crop_into(pixels(s[field], s.get(_SHAPE)), arr[len(keys)], box_of(rows[j]), flip=flips[j])
                else:
                    decode_into(s[field], arr[len(keys)], box_of(rows[j]), flip=flips[j])
            except _BAD_DATA as e:
                if fail is None or isinstance(e, ConfigError):
                    raise
                fail(j, e)
                continue
            keys.append(s.get("__key__", ""))
            has_label = has_label or lab is not None
            labs.append(-1 if lab is None else lab)
            others.append(fields)
        batch = _image_batch(buf, keys, labs if has_label else None, others)
        return batch

    def _batch_generic(self, samples: list[dict[str, Any]], ids: np.ndarray, epoch: int,
                       labels: np.ndarray | None, fail: Fail | None) -> dict[str, Any]:
        out = []
        for j, s in enumerate(samples):
            try:
                out.append(self.decode_sample(s, int(ids[j]), epoch, None if labels is None else int(labels[j])))
            except _BAD_DATA as e:
                if fail is None or isinstance(e, ConfigError):
                    raise
                fail(j, e)
        return collate(out, self.pad)


class CoverDecoder:
    """Aspect-ratio bucket batches (``loader(batch_sampler=DistributedAspectRatioSampler(...))``):
    every image of a batch resized to cover the batch's bucket, cropped to it, maybe flipped.

    The batch's bucket is the one its images share (``bucket_of``); the crops are
    :func:`~fastfeed.decode.geometry.cover_crops` of the sizes the index records, a function of
    ``(seed, epoch, sample)`` like every crop here (``decode="dali"`` computes the same ones).
    Besides the fields of :class:`CpuDecoder`'s batches, each batch carries
    ``"original_size"`` (int64 ``B x 2``: each image's upright (height, width)) and
    ``"crop_top_left"`` (int64 ``B x 2``: the crop's corner in the image resized to cover the
    bucket, flipped when flipped), SDXL's conditioning. An image whose decoded size is not
    the one the index records is a :class:`~fastfeed.errors.SampleError` (or, with
    ``on_error="skip"``, a counted skip): its crop would be another image's.

    Args:
        base: the loader's CPU decoder (its seed, ``augment``, ``flip``, image field, decoder).
        shapes: int (K, 2) the buckets' (height, width).
        bucket_of: int (N,) each sample's bucket.
        sizes: int (N, 2) each sample's upright (height, width), as the index records them.
        crop: ``"random"`` or ``"center"`` placement when augmenting (``augment=False``: the center).

    Example:
        >>> dec = CoverDecoder(CpuDecoder(), shapes=np.array([[32, 48]]), bucket_of=np.zeros(1, int),
        ...                    sizes=np.array([[48, 64]]))
        >>> from tools.synth import make_jpeg
        >>> b = dec.decode_batch([{"__key__": "a", "jpg": make_jpeg(np.random.default_rng(0), (64, 48))}],
        ...                      np.array([0]), 0, None, None)
        >>> tuple(b["image"].shape), b["original_size"].tolist()
        ((1, 3, 32, 48), [[48, 64]])
    """

    def __init__(self, base: CpuDecoder, *, shapes: np.ndarray, bucket_of: np.ndarray, sizes: np.ndarray,
                 crop: str = "random") -> None:
        self.base = base
        self.shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 2)
        self.bucket_of = np.asarray(bucket_of)
        self.sizes = np.asarray(sizes)
        self.random = base.augment and crop == "random"
        self.flip = base.augment and base.flip
        self.transform, self.pad = base.transform, base.pad

    def crops(self, ids: np.ndarray, epoch: int) -> tuple[tuple[int, int], Any]:
        """The bucket (height, width) of the batch of samples ``ids``, and their :class:`CoverCrops`.

        Raises:
            ConfigError: ``ids`` is not one bucket's batch (a sampler that does not match the dataset).
        """
        b = np.unique(self.bucket_of[ids])
        if b.size != 1 or b[0] < 0:
            raise ConfigError(f"samples {ids[:8].tolist()} are not one bucket's batch of the batch_sampler; build the "
                              "DistributedAspectRatioSampler from the dataset the loader reads")
        H, W = (int(v) for v in self.shapes[int(b[0])])
        return (H, W), cover_crops(self.sizes[ids], H, W, seed=self.base.seed, epoch=epoch, ids=ids,
                                   random=self.random, flip=self.flip)

    def _box(self, want: tuple[int, int], box: tuple[int, int, int, int]) -> Callable[[int, int], tuple[int, ...]]:
        def check(h: int, w: int) -> tuple[int, ...]:
            if (h, w) != want:
                raise SampleError(f"the image is {h}x{w} (upright) but the index records {want[0]}x{want[1]} "
                                  "(sizes.npy): its header does not match the index; run `fastfeed shapes DST "
                                  "--overwrite` to read the sizes again, or pass on_error='skip'")
            return box
        return check

    def decode_batch(self, samples: list[dict[str, Any]], ids: np.ndarray, epoch: int,
                     labels: np.ndarray | None, fail: Fail | None) -> dict[str, Any]:
        """Decode, cover-crop and collate one bucket's batch; samples that fail go to ``fail`` (None: raise)."""
        base = self.base
        if not samples:
            z = torch.zeros((0, 2), dtype=torch.int64)
            return {"image": torch.zeros((0, 3, 0, 0), dtype=torch.uint8), "__key__": [], "original_size": z,
                    "crop_top_left": z.clone()}
        (H, W), c = self.crops(np.asarray(ids, dtype=np.int64), epoch)
        generic = base.transform is not None
        buf, arr = batch_buffer((0 if generic else len(samples), H, W, 3))
        boxes, flips, given = c.boxes.tolist(), c.flips.tolist(), None if labels is None else labels.tolist()
        sizes = self.sizes[ids].tolist()
        keys: list[str] = []
        labs: list[int] = []
        others: list[dict[str, Any]] = []
        kept: list[int] = []
        outs: list[dict[str, Any]] = []
        has_label = labels is not None
        for j, s in enumerate(samples):
            try:
                field = base._field(s)
                dst = np.empty((H, W, 3), np.uint8) if generic else arr[len(keys)]
                box = self._box((int(sizes[j][0]), int(sizes[j][1])), tuple(boxes[j]))
                if field == RAW_FIELD:
                    crop_into(pixels(s[field], s.get(_SHAPE)), dst, box, flip=flips[j])
                else:
                    base.images.decode_into(s[field], dst, box, flip=flips[j])
                lab = _label_of(s, None if given is None else given[j])
                fields = base._other_fields(s, field)
            except _BAD_DATA as e:
                if fail is None or isinstance(e, ConfigError):
                    raise
                fail(j, e)
                continue
            kept.append(j)
            if generic:
                out = {"__key__": s.get("__key__", ""), "image": dst, "original_size": tuple(sizes[j]),
                       "crop_top_left": tuple(c.top_left[j].tolist()), **fields}
                if lab is not None:
                    out["label"] = lab
                outs.append(base.transform(out))  # type: ignore[misc]
                continue
            keys.append(s.get("__key__", ""))
            has_label = has_label or lab is not None
            labs.append(-1 if lab is None else lab)
            others.append(fields)
        if generic:
            return collate(outs, self.pad)
        rows = np.asarray(kept, dtype=np.int64)
        batch = _image_batch(buf, keys, labs if has_label else None, others)
        batch["original_size"] = torch.from_numpy(np.asarray(self.sizes[ids], dtype=np.int64)[rows].reshape(-1, 2))
        batch["crop_top_left"] = torch.from_numpy(np.ascontiguousarray(c.top_left[rows]).reshape(-1, 2))
        return batch


def _image_batch(buf: np.ndarray, keys: list[str], labs: list[int] | None,
                 others: list[dict[str, Any]]) -> dict[str, Any]:
    """The batch of decoded images ``buf[:len(keys)]`` (NCHW), their keys, labels (None: no sample had
    one) and the other fields, each a list in the batch's order (None where a sample lacks it)."""
    batch: dict[str, Any] = {"image": nhwc_to_nchw(buf[: len(keys)]), "__key__": keys}
    if labs is not None:
        batch["label"] = torch.tensor(labs, dtype=torch.int64)
    names: dict[str, None] = {}
    for f in others:
        names.update(dict.fromkeys(f))
    for k in names:
        batch[k] = [f.get(k) for f in others]
    return batch
