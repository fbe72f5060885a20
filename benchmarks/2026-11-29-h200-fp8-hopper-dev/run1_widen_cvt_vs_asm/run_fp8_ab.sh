set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
timeout 200 python3 -m pytest -q -x tests/test_kernel.py -k "hopper or fp8_to_bf16" > $OUT/tests.txt 2>&1
tail -4 $OUT/tests.txt
timeout 300 python3 scratch/ab_fp8.py > $OUT/ab_fp8.txt 2>&1
grep -v "^check" $OUT/ab_fp8.txt | tail -14; grep -c "^check" $OUT/ab_fp8.txt; grep FAIL $OUT/ab_fp8.txt | head -3
