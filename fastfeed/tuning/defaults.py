"""The defaults ``tune`` and ``doctor`` share when the user gives no batch or image size.

A new user runs ``fastfeed tune DST`` or ``fastfeed doctor DST`` with no other flag. Both
then measure the same thing: batches of :data:`DEFAULT_BATCH_SIZE` samples, and images
resized to :data:`DEFAULT_IMAGE_SIZE` when the dataset has images (photos of different
sizes cannot be stacked into one batch otherwise); raw bytes (``decode=None``) are never
resized. :func:`resolve_defaults` decides, and :meth:`Defaults.line` says in one line what
was assumed, so the command can print it.

:func:`small_dataset_note` is the warning both give when one batch is larger than the
dataset a rank sees: then every epoch is one partial batch and no worker count helps.

Example:
    >>> d = resolve_defaults(has_images=True, batch_size=None, image_size="auto", decode="cpu")
    >>> d.batch_size, d.image_size
    (64, 224)
    >>> d.line()
    'assumed --image-size 224 --batch-size 64 (the data has images); pass them to change'
"""

from __future__ import annotations

from dataclasses import dataclass

from fastfeed._options import number
from fastfeed.errors import ConfigError

__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_IMAGE_SIZE", "Defaults", "check_demand", "resolve_defaults",
           "small_dataset_note"]

#: Per-rank batch size ``tune`` and ``doctor`` measure when none is given.
DEFAULT_BATCH_SIZE = 64
#: Output image size (square) when none is given and the dataset has images.
DEFAULT_IMAGE_SIZE = 224

ImageSize = int | tuple[int, int] | None


@dataclass(frozen=True)
class Defaults:
    """The batch and image size to measure with, and which of them were assumed.

    Attributes:
        batch_size: the per-rank batch size.
        image_size: the output image size (None: not resized).
        assumed: the CLI flags that were assumed, e.g. ``("--image-size 224",)``.
        has_images: whether the dataset has an image field.
    """

    batch_size: int
    image_size: ImageSize
    assumed: tuple[str, ...]
    has_images: bool

    def line(self) -> str:
        """One line saying what was assumed, or '' when the user gave everything."""
        if not self.assumed:
            return ""
        why = "the data has images" if self.has_images else "the data has no images"
        them = "them" if len(self.assumed) > 1 else "it"
        return f"assumed {' '.join(self.assumed)} ({why}); pass {them} to change"


def resolve_defaults(*, has_images: bool, batch_size: int | None, image_size: ImageSize | str,
                     decode: str | None) -> Defaults:
    """Fill in a missing batch size (``None``) and image size (``"auto"``).

    Args:
        has_images: the dataset has an image field.
        batch_size: the user's batch size, or None for :data:`DEFAULT_BATCH_SIZE`.
        image_size: the user's image size, None for "not resized", or ``"auto"``:
            :data:`DEFAULT_IMAGE_SIZE` when the dataset has images and is decoded, else None.
        decode: the decode mode (None: raw bytes, never resized).

    Example:
        >>> resolve_defaults(has_images=False, batch_size=None, image_size="auto", decode="cpu").line()
        'assumed --batch-size 64 (the data has no images); pass it to change'
    """
    assumed: list[str] = []
    if isinstance(image_size, str):
        if image_size != "auto":
            raise ConfigError(f"image_size={image_size!r}: give a number, (height, width), None or 'auto'")
        image_size = DEFAULT_IMAGE_SIZE if has_images and decode is not None else None
        if image_size is not None:
            assumed.append(f"--image-size {image_size}")
    if batch_size is None:
        batch_size = DEFAULT_BATCH_SIZE
        assumed.append(f"--batch-size {batch_size}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r} must be a positive integer")
    return Defaults(batch_size, image_size, tuple(assumed), has_images)


def check_demand(target_rate: object, step_time: object) -> tuple[float | None, float | None]:
    """What the training step consumes: ``target_rate`` (samples/s per rank) or ``step_time``
    (seconds per batch), at most one of them; returns both as floats (None: not given).

    Example:
        >>> check_demand(None, 0.25)
        (None, 0.25)
        >>> check_demand(None, "x")
        Traceback (most recent call last):
        ...
        fastfeed.errors.ConfigError: step_time='x' must be a number > 0 (seconds per batch)
    """
    if target_rate is not None and step_time is not None:
        raise ConfigError("give target_rate (samples/s per rank) or step_time (seconds per batch), not both")
    rate = number(0, above=True, none=True, unit="samples/s per rank")(target_rate, "target_rate")
    step = number(0, above=True, none=True, unit="seconds per batch")(step_time, "step_time")
    return rate, step


def small_dataset_note(num_samples: int, batch_size: int, world_size: int) -> str | None:
    """A warning when one batch is larger than the samples one rank sees per epoch, else None.

    Example:
        >>> small_dataset_note(100, 64, 1) is None
        True
        >>> small_dataset_note(40, 64, 1).split(":")[0]
        'the batch (64) is larger than the dataset per rank (40 samples)'
    """
    per_rank = num_samples // max(1, world_size)
    if batch_size <= per_rank:
        return None
    ranks = f" over {world_size} ranks" if world_size > 1 else ""
    return (f"the batch ({batch_size}) is larger than the dataset per rank ({per_rank} samples{ranks}): every "
            "epoch is one partial batch, so loading cannot overlap anything and num_workers=0 looks best. "
            "Measure the full dataset training uses, or pass the --batch-size training uses "
            f"(at most {max(1, per_rank)} for this one)")
