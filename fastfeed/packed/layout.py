"""The names of every file in a packed dataset folder (or object-store prefix).

``pack`` writes these names, ``loader``/``verify``/``info`` read them, and ``--overwrite``
removes exactly the files :data:`OWN_FILE` matches (nothing else in DST)::

    shard-000000.tar         shards (``.tar`` or ``.lmdb``), numbered from 0, 6+ digits
    shard-000000.idx         DALI's index of each tar shard
    offsets.npy              sidecar arrays of the index (see fastfeed.packed.index)
    checksums.npy            per-sample checksums (see fastfeed.formats.checksum)
    labels.npy, lengths.npy  optional sidecars
    shapes.npy               per-sample (height, width) of raw pixels (``pack --store raw|mixed:P``)
    sizes.npy                per-sample displayed (height, width) of the image (``pack``, ``fastfeed shapes``)
    skipped.txt              the inputs ``pack`` left out, one per line
    index.json               written last: the dataset is complete iff it exists
    .fastfeed-pack/          resume records of an unfinished ``pack`` (job.json, one per shard)
    .fastfeed-pack.lock      held (``flock``) by the ``pack`` writing here: its pid, host, start, command

Example:
    >>> shard_name(3, 1000, ".tar"), dali_index_name("shard-000003.tar"), resume_record("shard-000003.tar")
    ('shard-000003.tar', 'shard-000003.idx', '.fastfeed-pack/shard-000003.json')
    >>> bool(OWN_FILE.match("shard-000003.tar.123.tmp")), bool(OWN_FILE.match("notes.txt"))
    (True, False)
"""

from __future__ import annotations

import re

__all__ = [
    "CHECKSUMS_NAME",
    "INDEX_NAME",
    "JOB_RECORD",
    "LABELS_NAME",
    "LENGTHS_NAME",
    "LOCK_NAME",
    "OFFSETS_NAME",
    "OWN_FILE",
    "RESUME_DIR",
    "SHAPES_NAME",
    "SIDECARS",
    "SIZES_NAME",
    "SKIPPED_NAME",
    "dali_index_name",
    "resume_record",
    "shard_name",
]

INDEX_NAME = "index.json"
OFFSETS_NAME = "offsets.npy"
LABELS_NAME = "labels.npy"
LENGTHS_NAME = "lengths.npy"
SHAPES_NAME = "shapes.npy"
CHECKSUMS_NAME = "checksums.npy"
SIZES_NAME = "sizes.npy"
SIDECARS = (OFFSETS_NAME, LABELS_NAME, LENGTHS_NAME, SHAPES_NAME, CHECKSUMS_NAME, SIZES_NAME)
SKIPPED_NAME = "skipped.txt"
#: Folder of an unfinished ``pack``'s resume records; removed when the index is written.
RESUME_DIR = ".fastfeed-pack"
#: The lock a running ``pack`` holds in DST (removed when it ends; never one of :data:`OWN_FILE`).
LOCK_NAME = ".fastfeed-pack.lock"
#: The job identity of an unfinished ``pack``, inside DST.
JOB_RECORD = f"{RESUME_DIR}/job.json"
#: Files fastfeed writes into DST (``--overwrite`` removes these and nothing else).
OWN_FILE = re.compile(
    r"^(shard-\d{6,}\.(tar|lmdb|idx)(\.\d+\.tmp)?|index\.json|offsets\.npy|labels\.npy|"
    r"lengths\.npy|shapes\.npy|checksums\.npy|sizes\.npy|skipped\.txt|\.[a-z]+\.(json|npy|txt)\.tmp-\d+)$"
)


def shard_name(number: int, num_shards: int, suffix: str) -> str:
    """File name of shard ``number`` of ``num_shards`` (``shard-000003.tar``; wider past a million)."""
    width = max(6, len(str(num_shards - 1)))
    return f"shard-{number:0{width}d}{suffix}"


def dali_index_name(shard: str) -> str:
    """DALI index file name next to a tar shard (``shard-000003.idx``)."""
    return shard.rsplit(".", 1)[0] + ".idx"


def resume_record(shard: str) -> str:
    """Resume record of a shard, relative to DST (``.fastfeed-pack/shard-000003.json``)."""
    return f"{RESUME_DIR}/{shard.rsplit('.', 1)[0]}.json"
