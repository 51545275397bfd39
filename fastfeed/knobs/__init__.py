"""What ``fastfeed tune`` turns and what it found: the contract between tuning and loading.

- :mod:`fastfeed.knobs.space`: the knobs of a decode mode (``num_workers``,
  ``prefetch_factor``, DALI's threads and queue depth, ...) and their search space;
- :mod:`fastfeed.knobs.record`: the stored tune result, keyed by dataset, host and batch
  shape, which ``loader(num_workers="auto")`` looks up.

``fastfeed.tuning`` writes the record and ``fastfeed.loading`` reads it; both import this
package from below, neither imports the other for it.
"""
