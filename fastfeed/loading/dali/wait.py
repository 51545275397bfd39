"""The wait for a DALI pipeline's outputs, bounded: a pipeline that never returns is named.

``decode="dali"``'s main loop takes each output through :class:`OutputWait` (~50 us a batch):
past ``Workers(stall_timeout=)`` it logs a warning naming the pipeline and the batch (again
every 5 minutes), and with ``on_stall="raise"`` raises a :class:`~fastfeed.errors.StallError`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Any

from fastfeed.errors import StallError

__all__ = ["OutputWait"]

log = logging.getLogger(__name__)

_REPEAT_S = 300.0  # seconds between two warnings of one stall that lasts


class OutputWait:
    """Waits for a DALI pipeline's outputs on a helper thread, so that a pipeline that never
    returns is reported (``on_stall="log"``: a warning at ``stall_timeout``, again every 5
    minutes, and a line when it ends) or raised (``"raise"``: a StallError).

    ``share_outputs`` blocks in DALI's C++ code, which nothing interrupts; waiting for it from
    another thread is what lets the training thread look at the clock. Its errors (a sample
    DALI cannot decode) come back as they are.

    Example:
        >>> wait = OutputWait(stall_timeout=60, on_stall="log")
        >>> class Pipe:
        ...     def share_outputs(self):
        ...         return "outputs"
        >>> wait.outputs(Pipe(), "epoch 0, batch 0")
        'outputs'
    """

    def __init__(self, stall_timeout: float, on_stall: str) -> None:
        self.stall_timeout, self.on_stall = float(stall_timeout), on_stall
        self.stalls = 0
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def outputs(self, pipe: Any, where: str) -> Any:
        """``pipe.share_outputs()``, waited for as the class docstring says (``where``: for messages)."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fastfeed-dali-wait")
        future = self._pool.submit(pipe.share_outputs)
        t0 = time.monotonic()
        wait, said = self.stall_timeout, False
        while True:
            try:
                outs = future.result(timeout=wait)
                break
            except concurrent.futures.TimeoutError:
                waited = time.monotonic() - t0
                text = (f"DALI pipeline stalled: no batch for {waited:.0f} s ({where}); the pipeline has not "
                        "returned its output: DALI's own threads or the GPU hold it up (a decoder or a kernel "
                        "that does not return)")
                if self.on_stall == "raise":
                    self._pool.shutdown(wait=False)  # its thread stays in the pipeline
                    raise StallError(f"{text}; the pipeline is abandoned, the next batch builds new ones; "
                                     "Workers(stall_timeout=) sets the wait",
                                     state="the DALI pipeline does not return", waited=waited) from None
                if not said:
                    self.stalls += 1
                log.warning("%s; Workers(on_stall='raise') makes this an error, stall_timeout= sets the wait%s",
                            text, " (still)" if said else "")
                wait, said = _REPEAT_S, True
        if said:
            log.warning("DALI pipeline stall over: a batch came after %.0f s", time.monotonic() - t0)
        return outs
