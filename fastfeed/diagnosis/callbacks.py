"""The step monitor where frameworks train: a Lightning callback and an HF Trainer callback.

Accelerate and plain ``torchrun`` loops use :class:`~fastfeed.StepMonitor` directly
(``model = mon.watch(accelerator.prepare(model))``, ``for batch in mon(dl)``). Lightning and
the HF Trainer own their loops, so their callbacks mark each step from the framework's
hooks:

- :class:`LightningStepMonitor`: a step is one training batch (``on_train_batch_start`` to
  ``on_train_batch_end``); with ``accumulate_grad_batches=k`` the ranks synchronise once per
  ``k`` batches and the monitor counts the wait per ``k``; the DDP strategy's model is watched.
- :class:`TrainerStepMonitor`: a step is one optimizer step of the Trainer (``on_step_begin``
  to ``on_step_end``: all its gradient-accumulation batches); pass ``trainer=`` to watch the
  Trainer's DDP model (callbacks are not handed it).

Between two steps a framework logs, saves and evaluates; with a fastfeed loader the data wait is
the loader's own figure (its stats) and the rest counts as other; with another loader the whole
gap counts as data wait. Each callback imports its framework only when it is built, and says
how to install it when it is missing.

Example:
    >>> trainer = lightning.Trainer(callbacks=[fastfeed.LightningStepMonitor(every=50)])   # doctest: +SKIP
    >>> trainer = transformers.Trainer(model, args, train_dataset=ds)                     # doctest: +SKIP
    >>> trainer.add_callback(fastfeed.TrainerStepMonitor(trainer=trainer, html="monitor.html"))  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from fastfeed.diagnosis.monitor import StepMonitor
from fastfeed.diagnosis.monitor_report import MonitorReport
from fastfeed.errors import MissingDependencyError

__all__ = ["LightningStepMonitor", "TrainerStepMonitor"]

log = logging.getLogger("fastfeed.monitor")


def _is_ddp(model: Any) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(model, DistributedDataParallel)


class _Monitored:
    """What both callbacks share: the monitor, the report at the end, the page."""

    def _setup(self, monitor: StepMonitor | None, every: int, watch: bool, html: str | os.PathLike[str] | None,
               kwargs: dict[str, Any]) -> None:
        self.monitor = monitor if monitor is not None else StepMonitor(every=every, **kwargs)
        self.watch = watch
        self.html_path = html
        self.report: MonitorReport | None = None

    def _finish(self, is_zero: bool) -> None:
        self.report = self.monitor.report()
        if is_zero:
            log.info("%s", self.report.text())
            if self.html_path is not None:
                self.report.html(self.html_path)


# ---------------------------------------------------------------------- Lightning
class LightningStepMonitor(_Monitored):
    """A Lightning callback that runs a :class:`~fastfeed.StepMonitor` over ``fit``'s training batches.

    Args:
        monitor: the monitor to drive (default: ``StepMonitor(every=every, **kwargs)``).
        every: steps per window (raised to a multiple of ``accumulate_grad_batches``).
        watch: time the gradient all-reduce of the DDP strategy's model.
        html: rank 0 writes the report's page here at the end of ``fit``.
        **kwargs: more :class:`~fastfeed.StepMonitor` options (``timeout``, ``jsonl``, ...).

    Attributes:
        monitor: the :class:`~fastfeed.StepMonitor`.
        report: the :class:`~fastfeed.MonitorReport` of the last ``fit`` (every rank), else None.

    Example:
        >>> cb = fastfeed.LightningStepMonitor(every=50, html="monitor.html")     # doctest: +SKIP
        >>> lightning.Trainer(callbacks=[cb]).fit(model, train_dataloaders=dl)     # doctest: +SKIP
        >>> cb.report.verdict                                                      # doctest: +SKIP
        'compute-bound'
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> LightningStepMonitor:
        return object.__new__(_lightning_class() if cls is LightningStepMonitor else cls)

    def __init__(self, monitor: StepMonitor | None = None, *, every: int = 50, watch: bool = True,
                 html: str | os.PathLike[str] | None = None, **kwargs: Any) -> None:
        self._setup(monitor, every, watch, html, kwargs)

    def __reduce__(self) -> tuple[Any, ...]:  # the class is made at run time: rebuild it by the facade's name
        return (_rebuild, ("lightning", self.__dict__))

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        mon = self.monitor
        k = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        if k > 1 and mon.accumulation == 1:
            mon.accumulation, mon.every = k, -(-mon.every // k) * k
        mon.attach(trainer.train_dataloader)
        model = getattr(trainer.strategy, "model", None)
        if self.watch and _is_ddp(model):
            mon.watch(model)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.monitor.begin_wait()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.monitor.begin_step(batch)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.monitor.end_step()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.monitor.end_pass()  # validation inside an epoch is no training step

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.monitor.end_pass()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish(bool(trainer.is_global_zero))


@functools.lru_cache(maxsize=None)
def _lightning_class() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback
        except ImportError:
            raise MissingDependencyError("fastfeed.LightningStepMonitor needs Lightning: pip install lightning") \
                from None
    return type("LightningStepMonitor", (LightningStepMonitor, Callback),
                {"__module__": __name__, "__doc__": LightningStepMonitor.__doc__,
                 "__qualname__": "LightningStepMonitor"})


# ---------------------------------------------------------------------- the HF Trainer
class TrainerStepMonitor(_Monitored):
    """An HF Trainer callback that runs a :class:`~fastfeed.StepMonitor` over ``train()``'s optimizer steps.

    Args:
        monitor: the monitor to drive (default: ``StepMonitor(every=every, **kwargs)``).
        every: optimizer steps per window.
        trainer: the Trainer, so that its DDP model's gradient all-reduce is timed (callbacks are
            not handed the wrapped model); without it collectives count as compute.
        html: rank 0 writes the report's page here at the end of ``train()``.
        **kwargs: more :class:`~fastfeed.StepMonitor` options (``timeout``, ``jsonl``, ...).

    Attributes:
        monitor: the :class:`~fastfeed.StepMonitor`.
        report: the :class:`~fastfeed.MonitorReport` of the last ``train()`` (every rank), else None.

    Example:
        >>> trainer = transformers.Trainer(model=model, args=args, train_dataset=ds)           # doctest: +SKIP
        >>> trainer.add_callback(fastfeed.TrainerStepMonitor(trainer=trainer, every=50))       # doctest: +SKIP
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> TrainerStepMonitor:
        return object.__new__(_trainer_class() if cls is TrainerStepMonitor else cls)

    def __init__(self, monitor: StepMonitor | None = None, *, every: int = 50, trainer: Any = None,
                 html: str | os.PathLike[str] | None = None, **kwargs: Any) -> None:
        self._setup(monitor, every, True, html, kwargs)
        self.trainer = trainer

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, ("transformers", self.__dict__))

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loader = kwargs.get("train_dataloader")
        if loader is not None:
            self.monitor.attach(loader)
        model = getattr(self.trainer, "model_wrapped", None)
        if _is_ddp(model):
            self.monitor.watch(model)

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.monitor.begin_wait()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        per_step = int(getattr(args, "per_device_train_batch_size", 0) or 0) * \
            int(getattr(args, "gradient_accumulation_steps", 1) or 1)
        self.monitor.begin_step(samples=per_step or None)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.monitor.end_step()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.monitor.end_pass()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._finish(bool(state.is_world_process_zero))


@functools.lru_cache(maxsize=None)
def _trainer_class() -> type:
    try:
        from transformers import TrainerCallback
    except ImportError:
        raise MissingDependencyError("fastfeed.TrainerStepMonitor needs transformers: pip install transformers") \
            from None
    return type("TrainerStepMonitor", (TrainerStepMonitor, TrainerCallback),
                {"__module__": __name__, "__doc__": TrainerStepMonitor.__doc__, "__qualname__": "TrainerStepMonitor"})


def _rebuild(kind: str, state: dict[str, Any]) -> Any:
    """A callback back from pickle (Lightning's spawn strategies pickle the trainer's callbacks)."""
    cls = _lightning_class() if kind == "lightning" else _trainer_class()
    obj = object.__new__(cls)
    obj.__dict__.update(state)
    return obj
