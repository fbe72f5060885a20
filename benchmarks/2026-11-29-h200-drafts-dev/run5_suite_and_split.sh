set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 420 python3 -m pytest -q tests --ignore=tests/test_aot.py > $OUT/gpu_suite.txt 2>&1
echo "suite rc $?"; tail -6 $OUT/gpu_suite.txt
timeout 120 python3 scratch/stage_split2.py > $OUT/stage_split.txt 2>&1; cat $OUT/stage_split.txt | tail -9
