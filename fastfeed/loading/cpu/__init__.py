"""The CPU backend of ``fastfeed.loader()``: a ``torch.utils.data.DataLoader`` whose workers decode whole batches.

- :mod:`~fastfeed.loading.cpu.loader`: :class:`~fastfeed.loading.cpu.loader.Loader` and :func:`~fastfeed.loading.cpu.loader.cpu_loader`;
- :mod:`~fastfeed.loading.cpu.dataset`: the iterable of planned batches each worker reads and decodes;
- :mod:`~fastfeed.loading.cpu.sampled`, :mod:`~fastfeed.loading.cpu.tokens`: batches decided by a
  length-aware sampler, and packed token rows.
"""
