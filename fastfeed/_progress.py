"""CLI progress on stderr: a tqdm bar on a terminal, else a plain line every :data:`PROGRESS_EVERY` s.

Batch jobs (SLURM, CI) have no terminal: a bar there writes carriage returns into a log
file, and no progress at all looks like a hang. Off a terminal an update becomes one line
once :data:`PROGRESS_EVERY` seconds have passed since the start or the last line, and the
end gets a line once any was shown (a job shorter than that prints none).

Example:
    >>> bar = Progress("verify", "shard", tty=False)
    >>> bar.update(1, 4)  # doctest: +SKIP
    verify: 1/4 shards (25%), 31 s
"""

from __future__ import annotations

import sys
import time
from typing import Any

from fastfeed._util import format_bytes

__all__ = ["PROGRESS_EVERY", "PackProgress", "Progress"]

#: Seconds between progress lines when stderr is not a terminal.
PROGRESS_EVERY = 30.0


class Progress:
    """Progress on stderr: a tqdm bar on a terminal, else a plain line every :data:`PROGRESS_EVERY` s."""

    def __init__(self, desc: str, unit: str, tty: bool | None = None) -> None:
        self.desc, self.unit = desc, unit
        self.tty = sys.stderr.isatty() if tty is None else tty
        self._bar: Any = None
        self._start = time.monotonic()
        self._last: float | None = None

    def update(self, done: int, total: int, extra: str = "") -> None:
        if self.tty:
            if self._bar is None:
                from tqdm import tqdm

                self._bar = tqdm(total=total, unit=self.unit, unit_scale=True, desc=self.desc,
                                 dynamic_ncols=True, file=sys.stderr)
            self._bar.update(done - self._bar.n)
            if extra:
                self._bar.set_postfix_str(extra, refresh=False)
            return
        now = time.monotonic()
        due = now - (self._start if self._last is None else self._last) >= PROGRESS_EVERY
        if not (due or (done >= total and self._last is not None)):  # the end, once lines were shown
            return
        self._last = now
        share = f" ({done / total:.0%})" if total else ""
        print(f"{self.desc}: {done:,}/{total:,} {self.unit}s{share}, {now - self._start:,.0f} s"
              + (f", {extra}" if extra else ""), file=sys.stderr, flush=True)

    def label(self, desc: str) -> None:
        self.desc = desc
        if self._bar is not None:
            self._bar.set_description_str(desc, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class PackProgress(Progress):
    """``fastfeed pack`` progress: files, MB/s and ETA (a bar, or lines off a terminal)."""

    def __init__(self, tty: bool | None = None) -> None:
        super().__init__("pack", "file", tty)

    def __call__(self, files: int, files_total: int, nbytes: int, bytes_total: int) -> None:
        elapsed = max(time.monotonic() - self._start, 1e-6)
        self.update(files, files_total, f"{nbytes / elapsed / 1e6:.1f} MB/s of {format_bytes(bytes_total)}")

    def shards_done(self, done: int, total: int) -> None:
        """Called by ``--engine ray`` as shards finish: show them in the label."""
        self.label(f"pack {done}/{total} shards")
