#!/usr/bin/env python
"""wdstream against its peers, side by side, in one run.

Run it in the bench venv (``bash tools/setup_bench_env.sh`` builds it)::

    /work/benchvenv/bin/python tools/bench.py --output docs/BENCHMARKS.md  # full run
    /work/benchvenv/bin/python tools/bench.py --quick   # writes out/BENCHMARKS.md
    ... --before COMMIT   # also that commit's wdstream where a part can (read, fresh, mixture, rawtext)

Without ``--output`` the report goes to ``out/BENCHMARKS.md`` (gitignored); a ``--quick``
run refuses to write ``docs/BENCHMARKS.md``. The code is in ``tools/benchlib/``, one module
per part (``--parts``: pack, pack_large, read, resume, fresh, sequence, memory, remote with nginx,
bestfit, mixture, ray_pack, chat, gpu, rawtext, open_shards) and per shared job (corpus,
rounds, runner, readers, tables, report, before). This file is the entry point and the
child processes' one: ``--child SPEC`` runs one measurement (``benchlib.runner``),
``--serve-s3`` the remote part's loopback S3 helper.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["--child"]:
        from benchlib.runner import child_main

        child_main(argv[1])
    elif argv[:1] == ["--serve-s3"]:
        from benchlib.remote import serve_s3

        serve_s3()
    else:
        from benchlib.cli import main as bench_main

        bench_main(argv)


if __name__ == "__main__":
    main()
