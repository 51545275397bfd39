"""What pack stores beside the files as they are: raw pixels, token ids.

- :mod:`~fastfeed.packing.content.pixels`: ``--store raw`` / ``mixed``;
- :mod:`~fastfeed.packing.content.tokenize`: a tokenizer at pack time (``--tokenizer``);
- :mod:`~fastfeed.packing.content.tokens`: the token plan (which text field it reads), checked before writing.
"""
