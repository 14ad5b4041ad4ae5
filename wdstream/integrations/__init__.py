"""Trainer integrations: a :class:`~wdstream.Loader`'s state saved with each checkpoint of a
training framework and restored on resume, exactly, without replaying batches.

One module per framework, each importing its framework only when it is imported (so
``wdstream`` imports without any of them, and a missing one is a one-line ``ImportError``):

- :mod:`wdstream.integrations.hf`: ``WdstreamTrainer``, a Hugging Face ``transformers.Trainer``.
- :mod:`wdstream.integrations.lightning`: ``LoaderDataModule``, a Lightning ``LightningDataModule``.
- :mod:`wdstream.integrations.dcp`: ``LoaderState``, a ``torch.distributed.checkpoint`` ``Stateful``.

:mod:`wdstream.integrations.base` holds what they share. ``docs/INTEGRATIONS.md`` has a snippet
per framework, what is saved where, and the caveats.
"""
