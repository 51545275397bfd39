"""What ``fastfeed pack`` reads: every input format behind one source description.

- :mod:`~fastfeed.packing.sources.base`: sample specs, members, the problems of a source;
- :mod:`~fastfeed.packing.sources.scan`: list, group and validate a file tree (ImageFolder,
  files grouped by key) through :mod:`~fastfeed.packing.sources.tree` (local) or
  :mod:`~fastfeed.packing.sources.remote` (fsspec URLs);
- :mod:`~fastfeed.packing.sources.jsonl`, :mod:`~fastfeed.packing.sources.webdataset`: JSONL manifests, WebDataset tars;
- :mod:`~fastfeed.packing.sources.parquet`, :mod:`~fastfeed.packing.sources.hf`,
  :mod:`~fastfeed.packing.sources.columns`, :mod:`~fastfeed.packing.sources.rows`: tables (parquet, HF datasets).
"""
