"""``decode="dali"`` with an aspect-ratio ``batch_sampler``: the CPU path's cover crops, cut by DALI.

``fastfeed.loader(path, batch_sampler=DistributedAspectRatioSampler(...), decode="dali")``
delivers the batches of ``decode="cpu"``: each image resized to cover its batch's bucket,
cropped to it, maybe mirrored, with ``"original_size"`` and ``"crop_top_left"``. The crops
are not DALI's own: :class:`CoverFeed` computes them on the host for every batch it feeds, with
the one function the CPU decoder calls (:meth:`~fastfeed.decode.cpu.CoverDecoder.crops`, that
is :func:`~fastfeed.decode.geometry.cover_crops` of the sizes the index records), and feeds them
as ``meta`` columns (:data:`COLUMNS`): the pipeline decodes only the box
(``fn.decoders.image_slice``, EXIF orientation applied), resizes it to the bucket and mirrors
it (:func:`cover_images`). So the two backends cut the same pixels and differ only by their
resamplers.

An image whose decoded size is not the one the index records would be cut at another image's
box: the pipeline also outputs each image's upright shape (``fn.peek_image_shape``), and
:meth:`CoverFeed.mismatched` finds those rows, a :class:`~fastfeed.errors.SampleError` naming
the key, or with ``on_error="skip"`` a counted skip, as on the CPU path.

Example:
    >>> feed = CoverFeed(options)                                   # doctest: +SKIP
    >>> feed(planned, ids, epoch=0)[:, [OUT_H, OUT_W]]              # doctest: +SKIP
    array([[ 64, 128], [ 64, 128]])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastfeed.decode.cpu import CpuDecoder
from fastfeed.loading.dali.feed import META_COLUMNS
from fastfeed.loading.options import LoaderOptions
from fastfeed.loading.textopts import cover_decoder

__all__ = ["COLUMNS", "CoverFeed", "cover_images", "mismatch_message"]

#: The ``meta`` columns of a cover batch after the first :data:`~fastfeed.loading.dali.feed.META_COLUMNS`:
#: the crop box in the upright original (top, left, height, width), the bucket, the flip, and
#: ``crop_top_left`` (the crop's corner in the resized image), which comes back with the output.
TOP, LEFT, HEIGHT, WIDTH, OUT_H, OUT_W, FLIP, SHOWN_TOP, SHOWN_LEFT = range(META_COLUMNS, META_COLUMNS + 9)
COLUMNS = 9


class CoverFeed:
    """The cover crops of every batch fed (the ``extra`` of :class:`~fastfeed.loading.dali.feed.BatchFeeder`).

    Args:
        o: the loader's options, with a :class:`~fastfeed.sampling.aspect.DistributedAspectRatioSampler`
            as ``batch_sampler`` (its buckets and sizes; ``seed``, ``augment``, ``Crop(flip=,
            bucket_crop=)`` as for ``decode="cpu"``).
    """

    def __init__(self, o: LoaderOptions) -> None:
        self.crops = cover_decoder(CpuDecoder(augment=o.augment, seed=o.seed, flip=o.crop.flip), o.batch_sampler,
                                   o.crop.bucket_crop)
        self.sizes = np.asarray(o.batch_sampler.sizes, dtype=np.int64)

    def __call__(self, planned: np.ndarray, ids: np.ndarray, epoch: int) -> np.ndarray:
        """int64 (len(ids), :data:`COLUMNS`) for the fed ``ids`` of a batch planned as ``planned``
        (-1: a placeholder, cut at its top-left pixel and resized to the bucket)."""
        rows = np.zeros((len(ids), COLUMNS), dtype=np.int64)
        (h, w), _ = self.crops.crops(np.asarray(planned[:1], dtype=np.int64), epoch)
        rows[:, OUT_H - META_COLUMNS], rows[:, OUT_W - META_COLUMNS] = h, w
        real = ids >= 0
        rows[~real, HEIGHT - META_COLUMNS:WIDTH - META_COLUMNS + 1] = 1
        if real.any():
            _, c = self.crops.crops(ids[real], epoch)
            rows[real, :4] = c.boxes
            rows[real, FLIP - META_COLUMNS] = c.flips
            rows[real, SHOWN_TOP - META_COLUMNS:] = c.top_left
        return rows

    @staticmethod
    def top_left(meta: np.ndarray) -> np.ndarray:
        """int64 (B, 2): each image's ``crop_top_left`` (the CPU path's), from the ``meta`` rows it was fed with."""
        return meta[:, SHOWN_TOP:SHOWN_LEFT + 1]

    def mismatched(self, ids: np.ndarray, shapes: np.ndarray) -> list[int]:
        """Rows whose decoded upright (height, width) (``shapes``, (B, >=2)) is not the index's."""
        real = ids >= 0
        bad = real & (np.asarray(shapes)[:, :2] != self.sizes[np.maximum(ids, 0)]).any(axis=1)
        return np.flatnonzero(bad).tolist()


def mismatch_message(shape: Any, size: Any) -> str:
    """What a header that lies is (the words of :class:`~fastfeed.decode.cpu.CoverDecoder`'s check)."""
    return (f"the image is {int(shape[0])}x{int(shape[1])} (upright) but the index records {int(size[0])}x"
            f"{int(size[1])} (sizes.npy): its header does not match the index; run `fastfeed shapes DST "
            "--overwrite` to read the sizes again, or pass on_error='skip'")


def cover_images(d: Any, encoded: Any, meta: Any, decoder: dict[str, Any]) -> tuple[Any, Any, Any]:
    """DALI graph: the fed boxes decoded, resized to the bucket; the mirror flags; the upright shapes.

    ``d``: :func:`~fastfeed.loading.dali.backend.import_dali`; ``encoded`` / ``meta``: the
    pipeline's inputs; ``decoder``: the image decoder's arguments.
    """
    import nvidia.dali.math as dmath

    fn, types = d.fn, d.types
    upright = fn.peek_image_shape(encoded)  # (H, W, C), EXIF orientation applied
    size = fn.cast(upright, dtype=types.FLOAT)
    h, w = size[0], size[1]
    # a box outside the decoded image (a header that lies) is clamped into it, and its row refused after
    top = dmath.clamp(fn.cast(meta[TOP], dtype=types.FLOAT), 0.0, h - 1)
    left = dmath.clamp(fn.cast(meta[LEFT], dtype=types.FLOAT), 0.0, w - 1)
    bh = dmath.clamp(fn.cast(meta[HEIGHT], dtype=types.FLOAT), 1.0, h - top)
    bw = dmath.clamp(fn.cast(meta[WIDTH], dtype=types.FLOAT), 1.0, w - left)
    images = fn.decoders.image_slice(encoded, fn.stack(top, left), fn.stack(bh, bw), axis_names="HW",
                                     normalized_anchor=False, normalized_shape=False, **decoder)
    images = fn.resize(images, size=fn.cast(meta[OUT_H:OUT_W + 1], dtype=types.FLOAT))
    mirror = fn.cast(meta[FLIP], dtype=types.INT32)
    return images, mirror, upright
