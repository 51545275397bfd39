"""The ``decode="dali"`` backend of ``fastfeed.loader()``: NVIDIA DALI decodes on the GPU.

:func:`~fastfeed.loading.dali.backend.dali_loader` builds a
:class:`~fastfeed.loading.dali.pipeline.DaliLoader`, fed by the same plan and cursor as the
CPU backend (:mod:`fastfeed.loading.order`). DALI is imported lazily.
"""
