"""Where the shards of a pack plan are written: this machine, a Ray cluster, an object store.

- :mod:`~fastfeed.packing.engines.local`: a process pool on this machine (the default);
- :mod:`~fastfeed.packing.engines.ray`: one Ray task per shard (``--engine ray``);
- :mod:`~fastfeed.packing.engines.objstore`: a destination URL (``s3://...``), written shard by shard.

Every engine writes each shard with :func:`fastfeed.packing.write.write_shard`, so the output is the same.
"""
