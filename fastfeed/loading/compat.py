"""What HF Accelerate, Lightning and the HF ``Trainer`` need from a fastfeed :class:`~fastfeed.loading.api.Loader`.

A fastfeed loader already does what these frameworks add to a plain DataLoader: it
splits the data by rank (rank and world size from ``torch.distributed``, else
``RANK`` / ``WORLD_SIZE``), gives every rank the same number of batches, orders and
resumes its own batches (``set_epoch``, ``state_dict``). A framework that re-wraps or
re-creates the loader breaks that, so :class:`FrameworkHooks` (a base class of
``Loader``) tells each framework what to do with it:

- **Accelerate**: ``accelerator.prepare(..., loader, ...)`` returns the loader itself,
  in every dispatch mode (``dispatch_batches`` True, False or default, ``split_batches``,
  ``even_batches``): Accelerate's own guard against wrapping a loader twice
  (``_is_accelerate_prepared``) says it is ready. Batches stay on the CPU (pinned when
  CUDA is there); move them with ``.to(accelerator.device)``. Save and resume with
  ``accelerator.register_for_checkpointing(loader)``: ``save_state`` then writes
  ``loader.state_dict()`` (on the main process) and ``load_state`` loads it on every rank.
- **HF Trainer**: it prepares every loader it builds; return a fastfeed loader from
  ``get_train_dataloader`` / ``get_eval_dataloader`` (see ``docs/guides/integrations.md``).
- **Lightning**: ``fit``, ``validate`` and ``test`` use the loader as is (Lightning
  injects no sampler into an IterableDataset). ``predict`` always re-creates the loader
  to track sample indices; :func:`recreate_kwargs` gives it the arguments of an
  equivalent loader (same dataset, rank, order and worker settings, a fresh position
  and fresh ``stats``), through the attributes Lightning reads from loaders it made itself.

Example:
    >>> dl = fastfeed.loader("/data/imagenet-ff", batch_size=256)        # doctest: +SKIP
    >>> model, opt, dl = accelerator.prepare(model, opt, dl)             # doctest: +SKIP
    >>> accelerator.register_for_checkpointing(dl)                       # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

__all__ = ["FrameworkHooks", "recreate_kwargs"]

# the keyword arguments of Loader.__init__ that DataLoader keeps as attributes of the same name
_DATALOADER_ATTRS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "timeout",
                     "multiprocessing_context", "worker_init_fn")


def recreate_kwargs(loader: Any) -> dict[str, Any]:
    """Keyword arguments of ``Loader(**kwargs)`` for a loader equivalent to ``loader``.

    The same dataset object (so the same rank, order and decoding) and worker settings;
    the new loader starts at epoch 0 with its own ``stats`` and a fresh cursor built like
    ``loader``'s (:meth:`~fastfeed.loading.order.cursor.EpochCursor.fresh`: same plan, shape and
    ``seq_len`` / ``batch_sampler`` stream, no position). It does not reuse batch
    buffers (``reuse_buffers=False``): the buffer pool lives on the shared dataset and
    belongs to ``loader``'s workers.

    Example:
        >>> twin = type(dl)(**recreate_kwargs(dl))                        # doctest: +SKIP
        >>> len(twin) == len(dl)                                          # doctest: +SKIP
        True
    """
    kwargs = {name: getattr(loader, name) for name in _DATALOADER_ATTRS}
    if kwargs["num_workers"] == 0:  # DataLoader's defaults; Loader passes neither without workers
        kwargs["prefetch_factor"], kwargs["persistent_workers"] = None, False
    kwargs.update(dataset=loader.dataset, log_every=loader.stats.log_every or None,
                  workers_from=loader.workers_from, reuse_buffers=False, cursor=loader._cursor.fresh())
    return kwargs


class FrameworkHooks:
    """Attributes that Accelerate and Lightning read from a DataLoader; a base class of ``Loader``.

    - ``_is_accelerate_prepared = True``: ``Accelerator.prepare_data_loader`` returns
      such a loader unchanged (and still tracks it in ``accelerator._dataloaders``).
    - ``__pl_saved_args`` / ``__pl_saved_kwargs`` / ``__pl_saved_arg_names`` /
      ``__dataset``: what Lightning records on loaders it creates in its ``*_dataloader``
      hooks, and uses to re-create them (``predict``); here from :func:`recreate_kwargs`.
    """

    #: Accelerate: the loader shards by rank itself; nothing for ``prepare`` to wrap
    _is_accelerate_prepared = True


def _pl_saved_args(self: Any) -> tuple[()]:
    return ()


def _pl_saved_kwargs(self: Any) -> dict[str, Any]:
    return recreate_kwargs(self)


def _pl_dataset(self: Any) -> Any:
    return self.dataset


# set after the class body: a name starting with two underscores written inside it would
# be mangled (``_FrameworkHooks__pl_saved_args``), and Lightning reads the plain names
for _name, _getter in (("__pl_saved_args", _pl_saved_args), ("__pl_saved_kwargs", _pl_saved_kwargs),
                       ("__pl_saved_arg_names", _pl_saved_args), ("__dataset", _pl_dataset)):
    setattr(FrameworkHooks, _name, property(_getter))
