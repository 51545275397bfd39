"""The order of an epoch, pure numpy: one plan and one cursor for every backend.

Which samples each rank reads, in which order, batch by batch, as a function of
(index, seed, epoch, world shape); nothing here opens a shard, starts a process or reads
the loader's options (the caller builds the cursor: :func:`fastfeed.loading.sources.cursor_for`).

- :mod:`~fastfeed.loading.order.epoch`: one dataset's seeded order (shards, block shuffle) and a worker's batches;
- :mod:`~fastfeed.loading.order.selection`, :mod:`~fastfeed.loading.order.mixing`: ``subset``/``filter``, weights;
- :mod:`~fastfeed.loading.order.rankplan`: a rank's plan over one or several datasets;
- :mod:`~fastfeed.loading.order.elastic`, :mod:`~fastfeed.loading.order.position`: resume at another world shape;
- :mod:`~fastfeed.loading.order.seqpack`: documents laid end to end into rows of ``seq_len`` tokens;
- :mod:`~fastfeed.loading.order.state`, :mod:`~fastfeed.loading.order.cursor`: the resume state and the epoch cursor.
"""

#: Samples mixed together within a rank's share: the default of ``Order(shuffle_block=)``,
#: part of every order (here, without numpy, so the CLI builds its flags at once).
DEFAULT_SHUFFLE_BLOCK = 8192
