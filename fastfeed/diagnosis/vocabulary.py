"""One vocabulary for ``fastfeed doctor`` (offline) and the step monitor (live).

Both name the same things the same way:

- **stages** of the input pipeline that can limit it, as the loader's own timings classify
  them (:func:`fastfeed.loading.bottleneck.diagnose`): ``storage``, ``decode``, ``workers``,
  ``transfer``, and ``input-bound`` when the loader reports no stage times (DALI);
  ``not-input-bound`` when the loop hardly waits. :func:`stage_label` says each in words;
- **categories** of a training step's time, as :class:`fastfeed.StepMonitor` splits it
  (:data:`CATEGORIES`);
- the monitor's **verdicts** (:data:`VERDICTS`), each with its fix; the doctor's verdict is
  input-bound or not, limited by one of the stages.

Example:
    >>> stage_label("decode", num_workers=4)
    'decode + augmentation on the CPU'
    >>> stage_label("workers", num_workers=0)
    'num_workers=0 (loading in the training process)'
    >>> CATEGORIES
    ('data', 'compute', 'collective', 'wait', 'other')
    >>> pct(0.123), pct(0.004), pct(0.0)
    ('12%', '<1%', '0%')
"""

from __future__ import annotations

__all__ = ["CATEGORIES", "CATEGORY_LABELS", "STAGES", "STAGE_LABELS", "VERDICTS", "pct", "stage_label"]

#: What limits the input pipeline (:mod:`fastfeed.loading.bottleneck`); "input-bound": no stage times.
STAGES = ("storage", "decode", "workers", "transfer", "input-bound")

#: The stages in words (``workers`` depends on the worker count: :func:`stage_label`).
STAGE_LABELS = {"storage": "storage", "decode": "decode + augmentation on the CPU",
                "transfer": "the hand-off from the workers to the training loop", "input-bound": "the loader"}

#: A step's time on one rank, in the order the monitor reports it.
CATEGORIES = ("data", "compute", "collective", "wait", "other")

#: The categories in words.
CATEGORY_LABELS = {
    "data": "data wait",                 # blocked in next() (and the host-to-device copy)
    "compute": "compute",                # the step's own work (forward, backward, optimizer)
    "collective": "collective",          # gradient collectives that compute did not hide
    "wait": "wait for slowest rank",     # from the ranks' busy times: no clock sync needed
    "other": "other",                    # between steps: the monitor, the framework's hooks
}

#: The step monitor's verdicts, in the order it weighs them.
VERDICTS = ("input-bound", "imbalanced", "straggler", "communication-bound", "compute-bound")


def stage_label(kind: str, num_workers: int | None) -> str:
    """A stage kind in words, as the doctor's and the monitor's verdicts write it."""
    if kind == "workers":
        if num_workers == 0:
            return "num_workers=0 (loading in the training process)"
        return f"too few workers ({num_workers})"
    return STAGE_LABELS.get(kind, kind)


def pct(share: float) -> str:
    """A share of step time as the reports write it: ``12%``, ``<1%``, ``0%``."""
    return f"{share:.0%}" if share >= 0.005 or share == 0 else "<1%"
