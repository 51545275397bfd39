"""``fastfeed pack``, ``info`` and ``verify``: make a packed dataset, say what it holds, check it.

``info`` and ``verify`` print the library's reports (:class:`~fastfeed.packed.checks.InfoReport`,
:class:`~fastfeed.packed.checks.VerifyReport`); ``pack`` prints a :class:`PackSummary` of the
index it returns, which also says whether DST was already complete (its index untouched).

Example:
    >>> from fastfeed.cli import main
    >>> main(["info", "/data/imagenet-ff"])   # doctest: +SKIP
    /data/imagenet-ff
      format     tar, DALI index files (packed from imagefolder by fastfeed 0.1.0, index v2)
    ...
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastfeed._progress import PackProgress, Progress
from fastfeed.cli.args import add_json, add_option_flags, auto_int, option_args
from fastfeed.cli.command import EXIT_OK, EXIT_PROBLEMS, Command
from fastfeed.errors import ConfigError, FastfeedError
from fastfeed.packing.options import PackOptions

if TYPE_CHECKING:
    from fastfeed.packed.index import DatasetIndex

__all__ = ["INFO", "PACK", "PACK_FLAGS", "VERIFY", "PackSummary"]


# ---------------------------------------------------------------- pack
#: The options of ``pack()`` that ``fastfeed pack`` takes, in the order of its ``--help``; each
#: flag, its help line and default come from the option's definition (:mod:`fastfeed.packing.options`).
PACK_FLAGS = ("input", "columns", "key", "tokenizer", "tokenize", "format", "shard_size", "samples_per_shard",
              "workers", "shuffle", "seed", "max_side", "store", "quality", "jpeg_restarts", "max_pixels", "length",
              "on_error", "allow_outside", "overwrite")


def add_pack(p: argparse.ArgumentParser) -> None:
    """The arguments of ``fastfeed pack``."""
    p.add_argument("src", metavar="SRC", help="an ImageFolder, a folder of files grouped by key, a JSONL manifest, "
                   "a .parquet file (or a folder or quoted glob of them), or a datasets save_to_disk folder")
    p.add_argument("dst", metavar="DST", help="output folder (created; must not be inside SRC), or an "
                   "object-store URL such as s3://bucket/prefix")
    add_option_flags(p, PackOptions, PACK_FLAGS)  # each flag from its option's definition
    p.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="local: --workers processes on this machine (default); ray: one Ray task per "
                        "shard on a Ray cluster, same output (pip install 'fastfeed[ray]')")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="with --engine ray: the head node's HOST:PORT, auto, or ray://HOST:PORT "
                        "(default: RAY_ADDRESS, else a new local Ray)")
    add_json(p, "summary")


@dataclass(frozen=True)
class PackSummary:
    """What ``fastfeed pack`` says about the dataset it packed (or found complete).

    Attributes:
        dst: the output folder or URL, as given.
        already_complete: True when DST already held this dataset and nothing was packed.
        num_samples, num_shards, format, bytes: the index's samples, shards, format and shard bytes.
        skipped: inputs left out (``--on-error skip``, listed in ``DST/skipped.txt``).
        input: the input kind pack read (``imagefolder``, ``files``, ...).
        classes: how many classes (None without classes).
        tokens: the total token count (``--tokenizer`` only, else None).
        tokenizer: the index's tokenizer entry (None without).
        store: the index's ``store`` entry (``--store raw`` / ``mixed:P``; None for JPEGs).
        outside: the index's ``outside`` entry, the files packed from outside SRC
            (``--allow-outside``; None when none were).

    Example:
        >>> s = PackSummary("ff", False, 60, 1, "tar", 1_200_000, 0, "imagefolder", 3)
        >>> print(s.text())
        packed 60 samples into 1 tar shard(s), 1.2 MB, in ff (input: imagefolder, 3 classes)
        check it before training (every shard read, every image decoded): fastfeed verify ff
    """

    dst: str
    already_complete: bool
    num_samples: int
    num_shards: int
    format: str
    bytes: int
    skipped: int
    input: str
    classes: int | None = None
    tokens: int | None = None
    tokenizer: dict[str, Any] | None = None
    store: dict[str, Any] | None = None
    outside: dict[str, Any] | None = None

    @classmethod
    def of(cls, index: DatasetIndex, dst: str, *, already_complete: bool) -> PackSummary:
        """The summary of the index ``pack()`` returned for ``dst``."""
        counted = index.tokenizer is not None and index.lengths is not None
        return cls(dst=dst, already_complete=already_complete, num_samples=index.num_samples,
                   num_shards=len(index.shards), format=index.format, bytes=sum(s.bytes for s in index.shards),
                   skipped=len(index.skipped), input=index.input,
                   classes=None if index.classes is None else len(index.classes),
                   tokens=int(index.lengths.sum()) if counted else None,
                   tokenizer=None if index.tokenizer is None else dict(index.tokenizer),
                   store=None if index.store is None else dict(index.store),
                   outside=None if index.outside is None else dict(index.outside))

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (what ``fastfeed pack --json`` prints); ``tokens`` only with a tokenizer,
        ``outside`` (``{"files", "roots"}``) only when files came from outside SRC."""
        out = {"dst": self.dst, "already_complete": self.already_complete, "num_samples": self.num_samples,
               "num_shards": self.num_shards, "format": self.format, "bytes": self.bytes, "skipped": self.skipped,
               "input": self.input, "classes": self.classes}
        if self.tokens is not None:
            out["tokens"] = self.tokens
        if self.outside is not None:
            out["outside"] = dict(self.outside)
        return out

    def text(self) -> str:
        """What ``fastfeed pack`` prints: what was packed (or found complete), then tokens, storage,
        skipped inputs and the ``fastfeed verify`` advice, where they apply."""
        from fastfeed._util import format_bytes
        from fastfeed.packed.checks import store_line

        if self.already_complete:
            lines = [f"already complete: {self.dst} holds these {self.num_samples} samples in {self.num_shards} "
                     f"{self.format} shard(s), {format_bytes(self.bytes)}; nothing was packed (--overwrite packs "
                     "again)"]
        else:
            lines = [f"packed {self.num_samples} samples into {self.num_shards} {self.format} shard(s), "
                     f"{format_bytes(self.bytes)}, in {self.dst} (input: {self._input_kind()})"]
        if self.tokens is not None:
            t = self.tokenizer or {}
            lines.append(f"{self.tokens} tokens of {t.get('field')} (vocabulary {t.get('vocab_size')}, "
                         f"{t.get('dtype') if t.get('tokens') else 'counted only'}, pad id {t.get('pad_id')})")
        if self.store is not None:
            lines.append(store_line(self.store, self.bytes))
        if self.outside is not None:
            lines.append(f"{self.outside['files']} file(s) from outside SRC (--allow-outside), in "
                         f"{', '.join(self.outside['roots'])}")
        if self.skipped:
            lines.append(f"skipped {self.skipped} input(s); see {self.dst}/skipped.txt")
        if not self.already_complete:
            lines.append(f"check it before training (every shard read, every image decoded): fastfeed verify "
                         f"{self.dst}")
        return "\n".join(lines)

    def _input_kind(self) -> str:
        """``imagefolder, 1000 classes``, ``files``..."""
        if self.classes is None:
            return str(self.input)
        return f"{self.input}, {self.classes} class{'es' if self.classes != 1 else ''}"


def _index_stamp(dst: str) -> Any:
    """What identifies DST's index.json now (None when there is none): unchanged = nothing was packed."""
    from fastfeed.packed.index import INDEX_NAME
    from fastfeed.storage.remote import filesystem, is_url

    try:
        if is_url(dst):
            fs, root = filesystem(dst)
            info = fs.info(f"{root.rstrip('/')}/{INDEX_NAME}")
            return tuple(sorted((str(k), str(v)) for k, v in info.items()))
        st = os.stat(os.path.join(dst, INDEX_NAME))
        return (st.st_ino, st.st_mtime_ns, st.st_size)
    except (OSError, ValueError, FastfeedError):
        return None


def run_pack(args: argparse.Namespace) -> int:
    """``fastfeed pack``: :func:`fastfeed.pack` with a progress bar, then its :class:`PackSummary`."""
    from fastfeed.packing.api import pack

    options = option_args(args, PackOptions, PACK_FLAGS)
    if args.ray_address is not None and args.engine != "ray":
        raise ConfigError("--ray-address needs --engine ray")
    bar = PackProgress()
    ray_log = logging.getLogger("fastfeed.pack.ray")
    ray_level = ray_log.level
    if args.engine == "ray" and not bar.tty:
        ray_log.setLevel(logging.INFO)  # no terminal (a cluster job's log): the engine's shard lines too
    before = None if args.overwrite else _index_stamp(args.dst)
    try:
        idx = pack(args.src, args.dst, **options, progress=bar, engine=args.engine, ray_address=args.ray_address)
    finally:
        ray_log.setLevel(ray_level)
        bar.close()
    done = before is not None and before == _index_stamp(args.dst)  # pack() found it complete
    summary = PackSummary.of(idx, args.dst, already_complete=done)
    print(json.dumps(summary.to_json(), indent=1) if args.json else summary.text())
    return EXIT_OK


# ---------------------------------------------------------------- info
def add_info(p: argparse.ArgumentParser) -> None:
    """The arguments of ``fastfeed info``."""
    p.add_argument("dst", metavar="DST", help="a packed dataset folder (or a folder of WebDataset tars)")
    add_json(p, "summary")


def run_info(args: argparse.Namespace) -> int:
    """``fastfeed info``: the :class:`~fastfeed.packed.checks.InfoReport` of DST."""
    from fastfeed.packed.checks import info

    report = info(args.dst)
    print(json.dumps(report.to_json(), indent=1) if args.json else report.text())
    return EXIT_OK


# ---------------------------------------------------------------- verify
def add_verify(p: argparse.ArgumentParser) -> None:
    """The arguments of ``fastfeed verify``."""
    p.add_argument("dst", metavar="DST", help="a packed dataset folder (or a folder of WebDataset tars: "
                   "members read, images decoded)")
    p.add_argument("--workers", default="auto", metavar="N", help="processes (default auto: one per core)")
    p.add_argument("--no-decode", action="store_true", help="skip decoding images (bytes and checksums only)")
    add_json(p, "report")


def run_verify(args: argparse.Namespace) -> int:
    """``fastfeed verify``: the :class:`~fastfeed.packed.checks.VerifyReport` of DST (problems on
    stderr); exit 1 when it found any."""
    from fastfeed.packed.checks import verify

    workers = auto_int(args.workers, "--workers")  # "auto": verify() counts the usable cores (cgroup quota too)
    bar = Progress("verify", "shard")
    try:
        report = verify(args.dst, workers=workers, decode=not args.no_decode, progress=bar.update)
    finally:
        bar.close()
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(report.text(), file=sys.stdout if report.ok else sys.stderr)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


PACK = Command("pack", "pack small files (ImageFolder, files by key, JSONL) into tar or LMDB shards + an index",
               add_pack, run_pack)
INFO = Command("info", "summarise a packed dataset", add_info, run_info)
VERIFY = Command("verify", "check a packed dataset: checksums, every sample readable, every image decodable",
                 add_verify, run_verify)
