"""The pieces of ``tools/bench.py``; see that file for how to run it.

Shared jobs: ``common`` (shapes, paths), ``corpus`` (the text every tool packs), ``rounds``
(interleaving and per-round ratio spreads), ``runner`` (child processes and their PSS),
``readers`` (every reader behind one interface), ``tables`` and ``report`` (Markdown),
``env`` (machine and versions), ``cli`` (options and the order of the parts). One module per
part: ``pack``, ``read``, ``checksums`` (read with CRC32C checks on vs off), ``resume``,
``memory``, ``remote``; each has its child measurement, its ``measure(bench)`` and its
report ``section(results, notes)``.
"""
