set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; date -u
SH="H64L4B64Rlong65536x512 H16L4B64Rlong65536x512 H16L4B32Rlognormal16384 H128L4B32Rlognormal16384 H16L2B8C2048 H128L1B8C2048 H16L4B8C16384 H8L1B8C16384 H128L4B64C2048 H16L4B64C16384 H64L4B32C16384 H8L2B64C2048 H16L4B64Rlong65536x512-fp8"
timeout 200 python3 scratch/ab_w.py $SH 2>&1 | grep -v "stale" | tee $OUT/ab_w.txt
date -u
