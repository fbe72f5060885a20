set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
timeout 200 python3 scratch/ab_v5.py 2>&1 | grep -v stale | tee $OUT/ab.txt
timeout 200 python3 -m pytest -q -x tests/test_kernel.py -k "hopper or graph" > $OUT/tests.txt 2>&1
tail -5 $OUT/tests.txt
