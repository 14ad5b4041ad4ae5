#!/usr/bin/env bash
# Build the separate virtual environment that tools/bench.py runs in (default /work/benchvenv).
#
# Why a separate venv: mosaicml-streaming pins numpy<2.2, and both mosaicml-streaming and
# litdata import torchvision, which must match torch exactly. On this machine the CPU build
# torch==2.13.0+cpu next to torchvision==0.28.0 (a CUDA build) fails at import with
# "operator torchvision::nms does not exist", so the only importable pair found here is
# torch==2.14.1 + torchvision==0.29.1 (CUDA builds that run on the CPU, ~5.5 GB, taken from
# the local wheel cache). wdstream and every peer are then measured on the same torch.
#
# The peers are installed with --no-deps and only the dependencies their import and local
# use need (their cloud SDKs -- google-cloud-storage, azure, oci, paramiko -- are left out).
#
# The remote part's "HTTP nginx" rows need an nginx binary, a system package this script does
# not install (it needs root): `sudo apt-get install nginx-light` on Debian/Ubuntu. The bench
# starts nginx itself as the current user (its own config in a temp dir); without it those
# rows say "skipped: nginx not installed".
#
# Usage: bash tools/setup_bench_env.sh [VENV]      (about 3 minutes here)
set -euo pipefail
VENV=${1:-/work/benchvenv}
ROOT=$(cd "$(dirname "$0")/.." && pwd)

python3 -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q --upgrade pip
"$PIP" install -q "torch==2.14.1" "torchvision==0.29.1"
"$PIP" install -q -e "$ROOT[ray]"   # the ray_pack part runs Ray (ray[data])
# the peers, without their cloud SDKs
"$PIP" install -q --no-deps "mosaicml-streaming==0.13.0" "litdata==0.2.76"
"$PIP" install -q \
    "numpy<2.2" "xxhash<4" "transformers<5" Brotli python-snappy zstd catalogue tqdm \
    lightning-utilities filelock tifffile obstore boto3 requests pillow \
    "psutil>=5.9" "moto[server]>=5.0" "webdataset>=0.2.86" "bpe-openai>=0.1.4" "torch==2.14.1" "torchvision==0.29.1"
# so that tests/test_bench_smoke.py runs here with psutil and the peers (its PSS and
# mosaicml/litdata tests skip in the dev venv, which has neither)
"$PIP" install -q "pytest>=8" "pytest-timeout>=2.2" "hypothesis>=6.100"
"$VENV/bin/python" - <<'PY'
import importlib
for name in ("torch", "torchvision", "numpy", "streaming", "litdata", "webdataset", "tiktoken",
             "bpe_openai", "moto", "psutil", "wdstream"):
    mod = importlib.import_module(name)
    print(f"{name:12s} {getattr(mod, '__version__', '?')}")
PY
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
    echo "hint: no nginx found; the remote part's nginx rows will be skipped." \
        "Install it with: sudo apt-get install nginx-light"
fi
echo "bench venv ready: $VENV/bin/python tools/bench.py --quick   (or --output docs/BENCHMARKS.md for the full run)"
echo "its smoke tests:  $VENV/bin/python -m pytest -q tests/test_bench_smoke.py"
