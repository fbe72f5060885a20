set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
mkdir -p $OUT
date -u
timeout 200 python3 scratch/ab_shares.py > $OUT/ab_shares.txt 2>&1
echo "ab rc=$?"
grep -v "stale\|warn\|^case" $OUT/ab_shares.txt | tail -21
timeout 150 python3 -m pytest -q -x -m gpu tests/test_kernel.py > $OUT/gpu_kernel_tests.txt 2>&1
echo "gpu tests rc=$?"; tail -2 $OUT/gpu_kernel_tests.txt
SHAPES="H8L2B64C65536 H8L2B8C2048 H16L4B64C16384 H16L4B32Rlognormal16384 H16L4B64Rlong65536x512 H16L4B1C16384 H64L4B32C16384 H64L4B8Rlognormal16384 H128L2B32C16384 H128L4B32C16384 H128L4B1C65536 H128L4B64C2048 H16L4B32C16384 H128L4B32Rlognormal16384"
MLA_VERIFY_COMMIT=$1 timeout 150 python3 scripts/bench.py --out $OUT/bench --contenders tuned flashinfer --rep-ms 20 --rounds 2 --shapes $SHAPES > $OUT/bench.log 2>&1
echo "bench rc=$?"
grep -A20 "^shape " $OUT/bench.log | head -20
cd $OUT && tar czf bench.tgz bench && rm -rf bench
