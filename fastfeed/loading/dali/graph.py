"""fastfeed's DALI graph: the pipeline a :class:`~fastfeed.loading.dali.pipeline.DaliLoader`
runs, and the one-image pipeline that finds which sample of a failed batch DALI cannot decode.

Random-crop decode (ROI decode: only the crop is decoded) -> resize to ``image_size`` ->
random flip -> ``crop_mirror_normalize`` to uint8 or float, NCHW or NHWC; without
``augment``, the CPU path's evaluation crop box computed from each image's header. The
graph reads only :class:`~fastfeed.loading.options.LoaderOptions`; DALI itself comes in as
the namespace of :func:`fastfeed.loading.dali.backend.import_dali` (nothing here imports it
at module level).

Example:
    >>> pipe = build_pipeline(import_dali(), options, seed=pipeline_seed(options, 0, 0, 1))  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastfeed.loading.dali.cover import cover_images
from fastfeed.loading.dali.feed import LABEL
from fastfeed.loading.options import LoaderOptions
from fastfeed.loading.textopts import max_batch

__all__ = ["ENCODED", "META", "PROBE", "build_pipeline", "pipeline_seed", "probe_pipeline", "split_threads"]

#: The pipeline's inputs, fed with ``Pipeline.feed_input`` (see :meth:`DaliLoader._feed_one`).
ENCODED, META = "ff_encoded", "ff_meta"


def build_pipeline(d: Any, o: LoaderOptions, seed: int, *, num_threads: int | None = None) -> Any:
    """Define and build fastfeed's DALI pipeline (``d``: :func:`~fastfeed.loading.dali.backend.import_dali`),
    fed batch by batch through two inputs:
    :data:`ENCODED` (the image bytes) and :data:`META` (the int64 rows of
    :class:`~fastfeed.loading.dali.feed.BatchFeeder`, the label in column
    :data:`~fastfeed.loading.dali.feed.LABEL`).

    Outputs: images (uint8/float, NCHW/NHWC), labels (int64), meta (int64 (B, 5), CPU); with an
    aspect-ratio ``batch_sampler``, the images are the fed cover crops
    (:func:`~fastfeed.loading.dali.cover.cover_images`) and a fourth output holds their upright shapes.
    ``num_threads``: this pipeline's CPU threads (default ``o.dali.num_threads``; a loader of
    several pipelines gives each its share, :func:`split_threads`).

    Example:
        >>> pipe = build_pipeline(import_dali(), options, seed=1)   # doctest: +SKIP
    """
    fn, types = d.fn, d.types
    h, w = o.image_size or (0, 0)  # loader_options() requires one for decode="dali" (or an aspect sampler)
    threads = o.dali.num_threads if num_threads is None else num_threads
    cover = o.batch_sampler is not None  # an aspect-ratio sampler's batches: fastfeed's crops (loading.dali.cover)
    pipe = d.Pipeline(batch_size=max_batch(o.batch_sampler) if cover else o.batch_size, num_threads=threads,
                      device_id=o.dali.device_id, seed=seed, prefetch_queue_depth=o.dali.prefetch_queue_depth)
    decoder = _decoder(d, o)
    with pipe:
        encoded = fn.external_source(name=ENCODED, no_copy=True, dtype=types.UINT8)
        meta = fn.external_source(name=META, no_copy=True, dtype=types.INT64)
        labels = meta[LABEL]
        shapes: Any = None
        mirror: Any = 0
        if cover:
            images, mirror, shapes = cover_images(d, encoded, meta, decoder)
        elif o.augment:
            images = fn.decoders.image_random_crop(
                encoded, random_area=list(o.crop.scale), random_aspect_ratio=list(o.crop.ratio),
                num_attempts=10, **decoder)
            images = fn.resize(images, resize_x=w, resize_y=h)
            mirror = fn.random.coin_flip(probability=0.5) if o.crop.flip else 0
        else:
            anchor, shape = _center_box(d, encoded, o)
            images = fn.decoders.image_slice(encoded, anchor, shape, axis_names="HW",
                                             normalized_anchor=False, normalized_shape=False, **decoder)
            images = fn.resize(images, resize_x=w, resize_y=h)
        norm: dict[str, Any] = {}
        if o.dali.output != "uint8":
            norm = {"mean": [255.0 * m for m in o.dali.mean or ()], "std": [255.0 * s for s in o.dali.std or ()]}
        dtype = {"uint8": types.UINT8, "float16": types.FLOAT16, "float32": types.FLOAT}[o.dali.output]
        images = fn.crop_mirror_normalize(
            images, dtype=dtype, output_layout="CHW" if o.dali.layout == "NCHW" else "HWC",
            mirror=mirror, **norm)
        outputs = (images, labels.gpu() if o.gpu else labels, meta)
        pipe.set_outputs(*outputs, *(() if shapes is None else (shapes,)))
    pipe.build()
    return pipe


def _center_box(d: Any, encoded: Any, o: LoaderOptions) -> tuple[Any, Any]:
    """The CPU path's evaluation crop (:func:`fastfeed.decode.geometry.center_crop`) as DALI
    graph arithmetic on each image's header size: (top, left) and (height, width)."""
    import nvidia.dali.math as dmath

    out_h, out_w = o.image_size or (0, 0)
    size = d.fn.cast(d.fn.peek_image_shape(encoded), dtype=d.types.FLOAT)  # upright (H, W, C)
    height, width = size[0], size[1]
    scale = dmath.min(height, width) * (o.crop.fraction / max(out_h, out_w))
    h = dmath.clamp(dmath.floor(scale * out_h + 0.5), 1.0, height)
    w = dmath.clamp(dmath.floor(scale * out_w + 0.5), 1.0, width)
    top, left = dmath.floor((height - h) * 0.5), dmath.floor((width - w) * 0.5)
    return d.fn.stack(top, left), d.fn.stack(h, w)


def pipeline_seed(o: LoaderOptions, epoch: int, step: int, builds: int, lane: int = 0) -> int:
    """The seed of DALI's augmentation generator for pipeline ``lane`` of the set built at
    (epoch, step) (lane 0's seed is the one a single pipeline has).

    Example:
        >>> o = LoaderOptions(batch_size=4, rank=0, world_size=1)
        >>> pipeline_seed(o, 0, 0, 1) == pipeline_seed(o, 0, 0, 1) != pipeline_seed(o, 1, 0, 1)
        True
        >>> pipeline_seed(o, 0, 0, 1, lane=1) != pipeline_seed(o, 0, 0, 1)
        True
    """
    entropy = [o.seed, o.rank, epoch, step, builds, 0xDA11] + ([lane] if lane else [])
    ss = np.random.SeedSequence(entropy)
    return int(ss.generate_state(1)[0] & 0x7FFFFFFF)


def split_threads(num_threads: int, num_pipelines: int) -> list[int]:
    """DALI's ``num_threads`` shared out between ``num_pipelines`` pipelines (>= 1 each).

    Why a share and not ``num_threads`` each: ``num_threads`` stays the number of CPU
    threads the loader keeps busy (what ``fastfeed tune`` counts as cores used), and what
    two pipelines win is the hardware decoder's idle time between one pipeline's
    iterations, not more threads (``benchmarks/dali_variants.py``'s ``two-pipes``: two
    pipelines of 8 threads against one of 16).

    Example:
        >>> split_threads(16, 2), split_threads(5, 2), split_threads(1, 3)
        ([8, 8], [3, 2], [1, 1, 1])
    """
    base, extra = divmod(num_threads, num_pipelines)
    return [max(1, base + (k < extra)) for k in range(num_pipelines)]


#: The input of :func:`probe_pipeline`.
PROBE = "ff_probe"


def probe_pipeline(d: Any, o: LoaderOptions) -> Any:
    """A one-image, synchronous pipeline with the loader's decoder (device, settings), fed
    through :data:`PROBE`: what decodes alone here is not what made a batch fail.

    Example:
        >>> pipe = probe_pipeline(import_dali(), options)   # doctest: +SKIP
    """
    decode = d.fn.decoders.image_random_crop if o.augment else d.fn.decoders.image
    pipe = d.Pipeline(batch_size=1, num_threads=1, device_id=o.dali.device_id, prefetch_queue_depth=1,
                      exec_async=False, exec_pipelined=False)
    with pipe:
        pipe.set_outputs(decode(d.fn.external_source(name=PROBE, dtype=d.types.UINT8), **_decoder(d, o)))
    pipe.build()
    return pipe


def _decoder(d: Any, o: LoaderOptions) -> dict[str, Any]:
    """The image decoder's arguments: mixed (GPU) or CPU, with the hardware decoder's share."""
    decoder: dict[str, Any] = {"device": "mixed" if o.gpu else "cpu", "output_type": d.types.RGB}
    if o.gpu:
        decoder["hw_decoder_load"] = o.dali.hw_decoder_load
    return decoder
