"""Attack wdstream with real faults and tabulate the outcomes: ``docs/RELIABILITY.md``.

Every attempt runs in a child process with a time limit and is classified as one of:

- ``clear error``: a :class:`wdstream.errors.WdstreamError`, or an ``OSError`` that names its
  file (for the CLI: a non-zero exit with an ``Error:``/``FAILED:`` message, no traceback);
- ``handled``: the data delivered equals the clean run's (the fault hit bytes nobody reads, or
  the fault was recovered from);
- ``silent wrong``: data delivered that differs from the clean run's, or exit 0 on bad input;
- ``crash``: any other exception or a traceback;
- ``hang``: the time limit ran out.

The goal is zeros in the last three columns. Usage::

    python tools/faults.py --output docs/RELIABILITY.md          # ~13 minutes on 2 busy cores
    python tools/faults.py --output /tmp/rel.md --scale 0.2      # a quick look
    python tools/faults.py --output /tmp/rel.md --only cursor    # attacks named *cursor*

The attacks are in ``tools/faultlib/``, one module per surface (``faultlib/__init__.py``
lists them); this file is the entry point.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from faultlib.attacks import ATTACKS  # noqa: E402
from faultlib.common import OUTCOMES, clean_dataset  # noqa: E402
from faultlib.report import write_report  # noqa: E402
from faultlib.runner import run_attempt  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument(
        "--output", required=True, help="Markdown file to write (e.g. docs/RELIABILITY.md)"
    )
    ap.add_argument(
        "--scale", type=float, default=1.0, help="Fraction of the random attempts to make"
    )
    ap.add_argument(
        "--timeout", type=float, default=60.0, help="Seconds before an attempt is a hang"
    )
    ap.add_argument(
        "--only", action="append", default=[], metavar="NAME",
        help="Run only the attacks whose name contains NAME (repeatable); the report then "
        "covers those only and must not replace docs/RELIABILITY.md",
    )  # fmt: skip
    args = ap.parse_args()
    attacks = [a for a in ATTACKS if not args.only or any(o in a.name for o in args.only)]
    if not attacks:
        ap.error(f"--only {args.only} matches none of: {', '.join(a.name for a in ATTACKS)}")
    rows = []
    notes: list[str] = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="wdstream-faults-") as tmp:
        work = Path(tmp)
        clean_dataset(work)
        for attack in attacks:
            counts: Counter[str] = Counter()
            said: list[str] = []
            for attempt in attack.attempts(work, args.scale):
                outcome = run_attempt(attempt, args.timeout)
                said.append(outcome)
                kind = outcome.split(":", 1)[0]
                counts[kind if kind in OUTCOMES else "crash"] += 1
                if kind not in ("clear error", "handled"):
                    notes.append(f"- {attack.name}: {outcome}")
            rows.append((attack, counts, said))
            print(f"{attack.name}: {dict(counts)}", flush=True)
    write_report(Path(args.output), rows, notes, time.monotonic() - start, args.scale)


if __name__ == "__main__":
    main()
