# Device command of one run: run_ab.sh PACKAGES SHAPE [SHAPE ...]
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; date -u
timeout 400 python3 scratch/ab.py "$@" 2>&1 | grep -v "stale" | tee $OUT/ab.txt
date -u
