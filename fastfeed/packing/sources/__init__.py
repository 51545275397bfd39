"""What ``fastfeed pack`` reads: every input format behind one :class:`~fastfeed.packing.sources.base.Source`.

- :mod:`~fastfeed.packing.sources.base`: the protocol the planner and the writer use, and the
  records every source shares (sample specs, members, items, a bad input met while reading);
- :mod:`~fastfeed.packing.sources.detect`: :func:`~fastfeed.packing.sources.detect.open_source`, the
  one detection: what SRC is, opened;
- listed sources (:mod:`~fastfeed.packing.sources.samples`, read back by
  :mod:`~fastfeed.packing.sources.reader`): a tree (:mod:`~fastfeed.packing.sources.tree` local,
  :mod:`~fastfeed.packing.sources.remote` fsspec URLs) grouped as an ImageFolder or files by key
  (:mod:`~fastfeed.packing.sources.folder`), a JSONL manifest (:mod:`~fastfeed.packing.sources.jsonl`),
  WebDataset tars (:mod:`~fastfeed.packing.sources.webdataset`);
- tables (:mod:`~fastfeed.packing.sources.table`): parquet files (:mod:`~fastfeed.packing.sources.parquet`),
  HF datasets (:mod:`~fastfeed.packing.sources.hf`), their columns and rows
  (:mod:`~fastfeed.packing.sources.columns`, :mod:`~fastfeed.packing.sources.rows`).
"""
