set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; date -u
timeout 220 python3 scratch/ab_cap.py H8L1B1C2048 H8L1B1C16384 H8L1B1C65536 H64L4B1C2048 H64L4B1C16384 H128L2B1C2048 H128L2B1C16384 H16L1B2C2048 H16L1B2C16384 H16L4B1C4096 H16L2B8C2048 2>&1 | grep -v stale | tee $OUT/ab_cap.txt
date -u
