"""The small library every benchmark in ``benchmarks/`` is written with.

======================  ===================================================================
module                  what it holds
======================  ===================================================================
:mod:`.data`            the benchmark datasets: generated and replicated JPEG folders, their
                        packs, made once under ``bench-data/``; the page-cache helpers
:mod:`.text`            the text corpus, tokenizer and packs of the text benchmarks
:mod:`.measure`         steady-state throughput through :mod:`fastfeed.timing` (warm-up until
                        the prefetch queue is full, then steady windows; median of repeats),
                        CPU per image, memory, and :class:`~.measure.Stopwatch`, the one clock
                        for one-off durations
:mod:`.report`          results, the ratio table against the peer measured in the same run,
                        text tables, the run's environment, JSON
:mod:`.loaders`         :func:`~.loaders.fastfeed_loader`: every ``fastfeed.loader`` the
                        benchmarks build, so its keyword spellings live in one place
:mod:`.peers`           the peers' loaders and packers (torchvision ImageFolder, WebDataset,
                        FFCV, litdata), each built its documented way
:mod:`.dali`            the DALI pipelines (fastfeed's and a hand-written one) and their
                        measurement, shared by the ``dali_*`` benchmarks; :mod:`.dali_thread`:
                        what a batch costs the training thread
:mod:`.trainer`         the transformer and the DDP training step of ``ddp_tokens``
:mod:`.imagestep`       the image-classification step of ``train_step`` (ResNets, a small
                        CNN) and its two timings: plain (a sync per step) and under
                        ``fastfeed.StepMonitor``
:mod:`.converge`         ``train_step``'s autotune convergence run: its bad start (a stored
                        tune record) and its table, a row per epoch
:mod:`.suite`           :class:`~.suite.Benchmark`: a grid of settings and peers declared as
                        data, the function that runs one point, and the report
======================  ===================================================================

Benchmarks run through one runner, ``benchmarks/run.py NAME`` (``make bench`` runs them all);
``python benchmarks/NAME.py ...`` is the same runner with the name filled in.
"""
