"""What pack stores beside the files as they are: raw pixels, token ids, table shards.

- :mod:`~fastfeed.packing.content.pixels`: ``--store raw`` / ``mixed``;
- :mod:`~fastfeed.packing.content.tokenize`: a tokenizer at pack time (``--tokenizer``);
- :mod:`~fastfeed.packing.content.tables`: the planning pieces of table inputs and token plans.
"""
