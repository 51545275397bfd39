"""The loader's stall watchdog: when no batch has come for a while, say which worker holds it up and why.

PyTorch's DataLoader waits for a worker's batch forever (``timeout=0``): a worker stopped
with SIGSTOP, or stuck in a read of a dead NFS mount, freezes the training loop without a
word. The watchdog makes such a stall visible and, if asked, an error:

- each worker publishes what it is doing in its row of a small shared-memory table
  (:class:`WorkerSlots`): its pid, its phase (reading, decoding, between batches), since
  when, the batch, and the dataset and shard it reads. That costs a few stores into a
  numpy row and one ``time.monotonic()`` per batch and per shard change, no system call;
- the training loop stores one timestamp when it asks for a batch and clears it when the
  batch comes (:meth:`Watchdog.watch`);
- a thread of the main process (:class:`Watchdog`) looks every few seconds; once the loop
  has waited ``stall_timeout`` seconds it reads the table and each worker's state from
  ``/proc/PID/stat`` (``T``: stopped, ``D``: in disk wait, ``S``: sleeping, ``R``: running)
  and logs one warning naming the worker the loop waits for, its state and its shard;
  again every :data:`REPEAT_S` seconds while the stall lasts, and one line when it ends.

With ``Workers(on_stall="raise")`` the DataLoader's own timeout is set to
``stall_timeout`` and its ``DataLoader timed out`` becomes a
:class:`~fastfeed.errors.StallError` with the same diagnosis. One wait no timeout of
PyTorch's covers: a worker stopped right after it sent a batch leaves the loop inside the
receive, asking the stopped process for the batch's shared memory (PyTorch's
file-descriptor sharing). Past ``stall_timeout`` (and a second) the watchdog then kills
the stopped workers, which ends the receive, and the loop raises the same StallError. With
``num_workers=0`` the loop reads in its own thread, which nothing can interrupt: the
watchdog logs, and remote reads end on their own bound (``Storage(timeout=, retries=)``).
A loader that raised a StallError has lost a worker: build a new one to go on.

The log lines, as they print (``fastfeed.loading.cpu.watchdog``, WARNING; one line each,
wrapped here): a worker stopped with SIGSTOP (the defaults), then two workers waiting on a
frozen store (``stall_timeout=2``)::

    loader stalled: no batch for 124 s (epoch 0, batch 1); worker 1 (pid 10706)
    is stopped (state T: SIGSTOP or a debugger; kill -CONT 10706 resumes it); worker 0 (pid
    10705) is between batches; Workers(on_stall='raise') makes this an error, stall_timeout=
    sets the wait

    loader stalled: no batch for 2 s (epoch 0, batch 2); worker 0 (pid 10567) is
    sleeping in a read (the storage is slow or not answering), in batch 2, on
    s3://my-bucket/imagenet-ff/shard-000002.tar since 13:23:52 (2 s); worker 1 (pid 10568) is
    sleeping in a read (the storage is slow or not answering), in batch 3, on
    s3://my-bucket/imagenet-ff/shard-000003.tar since 13:23:52 (2 s); Workers(on_stall='raise')
    makes this an error, stall_timeout= sets the wait

Example:
    >>> slots = WorkerSlots(2)
    >>> slot = slots.slot(1)
    >>> slot.claim(); slot.batch(0, 3); slot.shard(0, 5)
    >>> row = slots.rows()[1]
    >>> row.phase, row.batch, row.shard, row.pid == os.getpid()
    ('reading', 3, 5, True)
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from fastfeed.errors import StallError

__all__ = ["NO_SLOT", "PHASES", "REPEAT_S", "Slot", "SlotRow", "Stall", "Watchdog", "WorkerInit", "WorkerSlots",
           "WorkerState", "diagnose", "process_state", "shard_namer"]

log = logging.getLogger(__name__)

#: Seconds between two warnings of one stall that lasts.
REPEAT_S = 300.0
#: Raise mode: seconds past ``stall_timeout`` before the watchdog ends a wait the DataLoader's
#: timeout could not (see :meth:`Watchdog._end_stall`).
_GRACE_S = 1.0

# the columns of a worker's row
_PID, _PHASE, _SINCE, _EPOCH, _BATCH, _DATASET, _SHARD = range(7)
_COLUMNS = 7
PHASES = ("starting", "reading", "decoding", "between batches")
_STARTING, _READING, _DECODING, _IDLE = range(4)

_STATES = {
    "R": "running", "S": "sleeping", "D": "in disk wait", "T": "stopped", "t": "stopped by a debugger",
    "Z": "exited (a zombie)", "X": "exited", "I": "idle", "W": "paging", "P": "parked",
}


# ---------------------------------------------------------------------- what the workers publish
class Slot:
    """One worker's row of :class:`WorkerSlots`, written by that worker (or by the main process
    with ``num_workers=0``). Each call is a few stores into a numpy row."""

    __slots__ = ("_row",)

    def __init__(self, row: Any) -> None:
        self._row = row

    def claim(self) -> None:
        """This process is the row's worker (its pid), starting."""
        r = self._row
        r[_PID], r[_PHASE], r[_SINCE], r[_SHARD] = os.getpid(), _STARTING, time.monotonic(), -1

    def batch(self, epoch: int, b: int) -> None:
        """Batch ``b`` of ``epoch`` starts (its reads first)."""
        r = self._row
        r[_EPOCH], r[_BATCH], r[_PHASE], r[_SINCE] = epoch, b, _READING, time.monotonic()

    def shard(self, dataset: int, s: int) -> None:
        """Reading (opening, downloading) shard ``s`` of dataset ``dataset`` from now on."""
        r = self._row
        r[_DATASET], r[_SHARD], r[_PHASE], r[_SINCE] = dataset, s, _READING, time.monotonic()

    def decoding(self) -> None:
        """The batch's samples are read; decoding and collating them."""
        r = self._row
        r[_PHASE], r[_SINCE] = _DECODING, time.monotonic()

    def idle(self) -> None:
        """The batch is made; waiting to be asked for the next one."""
        r = self._row
        r[_PHASE], r[_SINCE] = _IDLE, time.monotonic()


class _NoSlot(Slot):
    """A slot that publishes nothing (a dataset used without a loader's watchdog)."""

    def __init__(self) -> None:
        super().__init__(None)

    def claim(self) -> None:
        pass

    def batch(self, epoch: int, b: int) -> None:
        pass

    def shard(self, dataset: int, s: int) -> None:
        pass

    def decoding(self) -> None:
        pass

    def idle(self) -> None:
        pass


#: The slot of a dataset that has no watchdog.
NO_SLOT: Slot = _NoSlot()


@dataclass(frozen=True)
class SlotRow:
    """What one worker last published (read by the main process)."""

    worker: int
    pid: int
    phase: str
    since: float  # time.monotonic() of the phase's (or shard's) start
    epoch: int
    batch: int
    dataset: int
    shard: int  # -1: none yet


class WorkerSlots:
    """A row per worker in shared memory: pid, phase, since when, epoch, batch, dataset, shard.

    Made by the main process before the workers start (they inherit it, or receive it
    pickled with the dataset, as torch shares tensors); each worker writes its own row.

    Args:
        num_workers: DataLoader workers (0: one row, the main process's).
    """

    def __init__(self, num_workers: int) -> None:
        self.t = torch.zeros((max(1, num_workers), _COLUMNS), dtype=torch.float64).share_memory_()
        self._rows: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"t": self.t}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.t, self._rows = state["t"], None

    def __len__(self) -> int:
        return int(self.t.shape[0])

    def slot(self, worker: int) -> Slot:
        """The row of ``worker`` (0 for the main process with ``num_workers=0``), to write."""
        if self._rows is None:
            self._rows = self.t.numpy()  # a view of the shared memory
        return Slot(self._rows[min(worker, len(self) - 1)])

    def reset(self) -> None:
        """Forget every row (before a new set of workers starts)."""
        self.t.zero_()

    def rows(self) -> list[SlotRow]:
        """Every worker's row as last published."""
        out = []
        for w, v in enumerate(self.t.tolist()):
            phase = int(v[_PHASE])
            out.append(SlotRow(w, int(v[_PID]), PHASES[phase] if 0 <= phase < len(PHASES) else "?", v[_SINCE],
                               int(v[_EPOCH]), int(v[_BATCH]), int(v[_DATASET]), int(v[_SHARD])))
        return out


class WorkerInit:
    """A DataLoader ``worker_init_fn`` that claims the worker's slot, then calls the user's.

    Picklable (a module-level class), so it works with any start method.
    """

    def __init__(self, slots: WorkerSlots, user: Callable[[int], None] | None) -> None:
        while isinstance(user, WorkerInit):  # a loader re-created from another's attributes
            user = user.user
        self.slots, self.user = slots, user

    def __call__(self, worker_id: int) -> None:
        self.slots.slot(worker_id).claim()
        if self.user is not None:
            self.user(worker_id)


def process_state(pid: int) -> str:
    """The state letter of process ``pid`` from ``/proc/PID/stat`` (``"R"``, ``"S"``, ``"D"``,
    ``"T"``, ...), ``"gone"`` when it does not exist, ``"?"`` where there is no ``/proc``.

    Example:
        >>> process_state(os.getpid()) in ("R", "S", "?")
        True
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except FileNotFoundError:
        return "gone" if os.path.isdir("/proc/self") else "?"
    except OSError:
        return "?"
    after = text.rsplit(")", 1)[-1].split()  # the command name, in parentheses, may hold spaces
    return after[0] if after else "?"


# ---------------------------------------------------------------------- the diagnosis
@dataclass(frozen=True)
class WorkerState:
    """One worker as the watchdog sees it: what it published and what the kernel says."""

    row: SlotRow
    state: str  # the /proc state letter, "gone" or "?"
    shard_name: str  # the shard it reads ("" when none)

    @property
    def stuck(self) -> bool:
        """Stopped, in disk wait or gone: it will not deliver by itself."""
        return self.state in ("T", "t", "D", "Z", "X", "gone")

    def verdict(self) -> str:
        """What it is doing, in words: ``"stopped (state T: ...)"``, ``"in disk wait (state D: ...)"``,
        ``"sleeping in a read (...)"``, ``"alive but slow (...)"``, ``"between batches"``."""
        pid, state, phase = self.row.pid, self.state, self.row.phase
        if state in ("T", "t"):
            return f"stopped (state {state}: SIGSTOP or a debugger; kill -CONT {pid} resumes it)"
        if state == "D":
            return "in disk wait (state D: a read the kernel cannot interrupt; a stuck file system, a dead NFS mount?)"
        if state in ("Z", "X", "gone"):
            return "gone (it exited)"
        if phase == "reading":
            return f"{_STATES.get(state, 'alive')} in a read (the storage is slow or not answering)"
        if phase == "decoding":
            return f"alive but slow ({_STATES.get(state, state)}, decoding)"
        return phase

    def context(self, now: float, wall: float) -> str:
        """Where it is: ``"in batch 3, on /data/ds/shard-000001.tar since 10:21:03 (12 s)"``."""
        if self.row.phase not in ("reading", "decoding"):
            return ""
        text = f"in batch {self.row.batch}"
        if self.shard_name and self.row.phase == "reading":
            at = time.strftime("%H:%M:%S", time.localtime(wall - (now - self.row.since)))
            text += f", on {self.shard_name} since {at} ({now - self.row.since:.0f} s)"
        return text

    def describe(self, now: float, wall: float) -> str:
        """``"is stopped (state T: ...), in batch 3, on ... since 10:21:03 (12 s)"``."""
        context = self.context(now, wall)
        return f"is {self.verdict()}" + (f", {context}" if context else "")


@dataclass(frozen=True)
class Stall:
    """What holds the loop up: how long it waited, the worker to blame (if any) and the others."""

    waited: float
    where: str  # "epoch 0, batch 3": the batch the loop waits for
    culprit: WorkerState | None
    others: tuple[WorkerState, ...]
    main_process: bool  # num_workers=0: the loop reads itself
    raising: bool = False  # on_stall="raise": this becomes the error

    def message(self, *, now: float | None = None, wall: float | None = None) -> str:
        """The one-line report (see the module docstring)."""
        now = time.monotonic() if now is None else now
        wall = time.time() if wall is None else wall
        parts = [f"loader stalled: no batch for {self.waited:.0f} s ({self.where})"]
        if self.culprit is not None:
            c = self.culprit
            who = (f"the loop itself (pid {c.row.pid}, num_workers=0)" if self.main_process
                   else f"worker {c.row.worker} (pid {c.row.pid})")
            parts.append(f"{who} {c.describe(now, wall)}")
        else:
            parts.append("no worker has started yet (a worker's start: its imports with 'spawn', worker_init_fn)")
        parts += [f"worker {o.row.worker} (pid {o.row.pid}) {o.describe(now, wall)}" for o in self.others]
        if self.main_process:
            fix = "remote reads end after Storage(timeout=, retries=)"
        elif self.raising:
            fix = "Workers(stall_timeout=) sets the wait"
        else:
            fix = "Workers(on_stall='raise') makes this an error, stall_timeout= sets the wait"
        return "; ".join(parts) + "; " + fix

    @property
    def stopped(self) -> list[WorkerState]:
        """The workers in state T (stopped): nothing but a signal moves them."""
        return [w for w in (self.culprit, *self.others) if w is not None and w.state == "T"]

    def error(self, *, killed: bool = False) -> StallError:
        """The :class:`StallError` of this stall (``killed``: the watchdog killed the workers to end it)."""
        c = self.culprit
        text = self.message()
        if killed:
            text += ("; the loader's workers were killed to end it (a stopped one blocks PyTorch's receive and "
                     "shutdown): the next pass starts new ones")
        return StallError(text, worker=None if c is None or self.main_process else c.row.worker,
                          pid=None if c is None else c.row.pid, state="" if c is None else c.verdict(),
                          shard="" if c is None else c.shard_name, waited=self.waited)


def diagnose(slots: WorkerSlots, *, waited: float, received: int, where: str, num_workers: int,
             shard_name: Callable[[int, int], str], raising: bool = False) -> Stall:
    """Read the slots and the workers' states: who holds the loop up.

    The loop waits for its ``received``-th batch of the pass, which the round-robin hands
    to worker ``received % num_workers``; a worker that is stopped, in disk wait or gone is
    blamed first, else that worker.
    """
    states = []
    for row in slots.rows():
        if row.pid <= 0:
            continue
        name = shard_name(row.dataset, row.shard) if row.shard >= 0 else ""
        states.append(WorkerState(row, process_state(row.pid), name))
    if not states:
        return Stall(waited, where, None, (), num_workers == 0, raising)
    awaited = received % max(1, num_workers)
    stuck = [s for s in states if s.stuck]
    culprit = stuck[0] if stuck else next((s for s in states if s.row.worker == awaited), states[0])
    others = tuple(s for s in states if s is not culprit)
    return Stall(waited, where, culprit, others, num_workers == 0, raising)


# ---------------------------------------------------------------------- the watchdog
class Watchdog:
    """Watches one loader's loop (see the module docstring).

    Args:
        slots: the workers' table (the loader's dataset writes it).
        stall_timeout: seconds the loop may wait for a batch.
        on_stall: ``"log"`` or ``"raise"`` (the latter through the DataLoader's timeout, and
            the thread for the wait no timeout covers: see the module docstring).
        num_workers: the loader's workers.
        shard_name: ``(dataset, shard) -> path or URL``, for the messages.
    """

    def __init__(self, slots: WorkerSlots, *, stall_timeout: float, on_stall: str, num_workers: int,
                 shard_name: Callable[[int, int], str]) -> None:
        self.slots, self.stall_timeout, self.on_stall = slots, float(stall_timeout), on_stall
        self.num_workers, self.shard_name = num_workers, shard_name
        self.stalls = 0  # stalls reported (log mode)
        self._asked = 0.0  # time.monotonic() when the loop asked for the batch it waits for; 0: not waiting
        self._reported = 0.0  # the _asked of the wait the thread reported as a stall (0: none)
        self._ending = 0.0  # raise mode: the _asked of the wait the thread looked at to end it
        self._pending: StallError | None = None  # raise mode: the error of a stall the thread had to end
        self._received = 0
        self._where = ""
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def torch_timeout(self) -> float:
        """The DataLoader ``timeout`` that raise mode needs (0: none)."""
        return self.stall_timeout if self.on_stall == "raise" and self.num_workers > 0 else 0.0

    def watch(self, it: Iterator[Any], epoch: int, start: int,
              reset: Callable[[], None] | None = None) -> Iterator[Any]:
        """Yield ``it``'s batches, marking each wait (a timestamp per batch).

        ``reset``: called when the watchdog had to kill workers to end a stall (raise mode),
        after ``it``'s workers were shut down, so that the next pass starts fresh ones.
        """
        self._start()
        if self.num_workers == 0:
            self.slots.slot(0).claim()
        self._received, self._where = 0, f"epoch {epoch}, batch {start}"
        clock = time.monotonic
        try:
            while True:
                self._asked = clock()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                except Exception as e:  # what a stall ended in becomes the StallError it is
                    pending, self._pending = self._pending, None
                    if pending is not None:  # the thread killed the workers to end the wait
                        _shut_down(it)
                        if reset is not None:
                            reset()
                        raise pending from e
                    if not (isinstance(e, RuntimeError) and str(e).startswith("DataLoader timed out")):
                        raise
                    stall = self.stall(clock() - self._asked)
                    if not (stall.stopped and self._kill(stall)):
                        raise stall.error() from e
                    _shut_down(it)
                    if reset is not None:
                        reset()
                    raise stall.error(killed=True) from e
                self._asked = 0.0
                if self._reported:  # the wait was reported: say that it is over
                    log.warning("loader stall over: a batch came after %.0f s", clock() - self._reported)
                    self._reported = 0.0
                self._received += 1
                self._where = f"epoch {epoch}, batch {start + self._received}"
                yield batch
        finally:
            self._asked = self._reported = 0.0

    def stall(self, waited: float) -> Stall:
        """The diagnosis now, for a wait of ``waited`` seconds."""
        return diagnose(self.slots, waited=waited, received=self._received, where=self._where,
                        num_workers=self.num_workers, shard_name=self.shard_name,
                        raising=self.on_stall == "raise" and self.num_workers > 0)

    def close(self) -> None:
        """Stop the thread (it also stops when the loader is collected)."""
        self._stop.set()

    # ------------------------------------------------------------------ the thread
    def _start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=_run, args=(weakref.ref(self), self._stop),
                                        name="fastfeed-watchdog", daemon=True)
        self._thread.start()

    def _look(self, last: list[float]) -> None:
        """One look: report a wait that passed the bound, again every REPEAT_S while it lasts
        (``last``: when this thread last reported it). The loop says when it is over."""
        asked, now = self._asked, time.monotonic()
        if not asked or now - asked < self.stall_timeout:
            return
        if self.on_stall == "raise" and self.num_workers > 0:
            if now - asked >= self.stall_timeout + _GRACE_S and self._ending != asked:
                self._ending = asked
                self._end_stall(asked, now)
            return
        if self._reported != asked:
            self._reported, last[:] = asked, [now]
            if self._asked != asked:  # the batch came meanwhile: no stall to report
                self._reported = 0.0
                return
            self.stalls += 1
            log.warning("%s", self.stall(now - asked).message())
        elif now - last[0] >= REPEAT_S:
            last[:] = [now]
            log.warning("%s (still)", self.stall(now - asked).message())

    def _end_stall(self, asked: float, now: float) -> None:
        """Raise mode, the DataLoader's timeout did not end the wait: the loop is inside PyTorch,
        receiving a batch whose shared memory a *stopped* worker must hand over (torch's
        file-descriptor sharing asks the sending process), which no timeout covers. The stopped
        workers are killed, so that the receive fails, and the loop raises this stall's error."""
        stall = self.stall(now - asked)
        if not stall.stopped:
            return  # nothing that a signal ends (disk wait: the kernel's; the DataLoader's timeout acts)
        self._pending = stall.error(killed=True)
        self._kill(stall)

    def _kill(self, stall: Stall) -> bool:
        """Kill the loader's workers, the stopped ones first (raise mode: the loader is given up).

        All of them: a stopped worker keeps PyTorch's shutdown waiting (5 s each, then SIGTERM,
        which a stopped process does not act on), and one killed while it held the lock of their
        result queue leaves the others unable to exit.
        """
        stopped = stall.stopped
        others = [w for w in (stall.culprit, *stall.others) if w is not None and w not in stopped]
        log.warning("%s; ending it: killing the stopped worker(s) %s and the loader's others (the next pass "
                    "starts new ones)", stall.message(), ", ".join(f"{w.row.worker} (pid {w.row.pid})" for w in stopped))
        killed = False
        for w in [*stopped, *others]:
            try:
                os.kill(w.row.pid, signal.SIGKILL)
                killed = True
            except (ProcessLookupError, PermissionError):
                pass
        return killed

    @property
    def poll_s(self) -> float:
        """How often the thread looks."""
        return min(5.0, max(0.05, self.stall_timeout / 4))


def _shut_down(it: Any) -> None:
    """Shut down the DataLoader iterator ``it``'s workers, which the watchdog killed.

    PyTorch's SIGCHLD handler raises "DataLoader worker ... is killed by signal" in the main
    thread, wherever it is, for every child signal while the iterator's workers are
    registered: the shutdown deregisters them (what Lightning does with
    ``_iterator._shutdown_workers()`` too), and the handler's errors that come meanwhile are
    taken here, not at some later line of the training loop.
    """
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is None:
        return
    for _ in range(16):
        try:
            shutdown()
            time.sleep(0.05)  # a child signal still on its way meets the deregistered workers
            return
        except RuntimeError:  # PyTorch's handler, for a worker killed above
            continue


def _run(ref: "weakref.ref[Watchdog]", stop: threading.Event) -> None:
    """The watchdog thread: holds its watchdog only weakly, so a dropped loader ends it."""
    last: list[float] = [0.0]
    while True:
        dog = ref()
        if dog is None:
            return
        poll = dog.poll_s
        try:
            dog._look(last)
        except Exception:  # a diagnosis must never take the training loop down
            log.debug("watchdog: the look failed", exc_info=True)
        del dog
        if stop.wait(poll):
            return


def shard_namer(indexes: Sequence[Any]) -> Callable[[int, int], str]:
    """``(dataset, shard) -> path or URL`` over the loader's indexes (``?`` when out of range)."""
    def name(dataset: int, shard: int) -> str:
        try:
            return str(indexes[dataset].shard_path(shard))
        except (IndexError, AttributeError):
            return f"shard {shard} of dataset {dataset}"
    return name
