set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 200 python3 scratch/timeline.py H64L4B64Rlong65536x512 H16L4B32Rlognormal16384 H16L4B8C16384 2>&1 | grep -v stale | tee $OUT/timeline3.txt
cd $OUT && tar czf tl.tgz tl_*.npy && rm tl_*.npy; date -u
