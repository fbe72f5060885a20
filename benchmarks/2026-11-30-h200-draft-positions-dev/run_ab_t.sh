set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; date -u
SH="H16L1B8C2048 H8L2B8C2048 H128L2B1C2048 H64L4B1C2048 H32L1B64C2048 H128L1B8C2048 H16L4B64C2048 H8L1B1C16384 H16L2B8C2048 H64L4B64Rlong65536x512"
timeout 250 python3 scratch/ab_t.py $SH 2>&1 | grep -v "stale" | tee $OUT/ab_t.txt
date -u
