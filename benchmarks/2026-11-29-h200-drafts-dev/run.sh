set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
SHAPES="H8L2B64C65536 H8L2B8C2048 H16L4B64C16384 H16L4B32Rlognormal16384 H16L4B64Rlong65536x512 H16L4B1C16384 H64L4B32C16384 H64L4B8Rlognormal16384 H128L2B32C16384 H128L4B32C16384 H128L4B1C65536 H128L4B64C2048 H16L4B32C16384"
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv
MLA_VERIFY_COMMIT=new timeout 200 python3 scripts/bench.py --out $OUT/bench_new --contenders tuned flashinfer --rep-ms 30 --shapes $SHAPES > $OUT/bench_new.log 2>&1
tail -22 $OUT/bench_new.log
(cd scratch/old && PYTHONPATH=/tmp/site:$PWD MLA_VERIFY_COMMIT=e471120 timeout 150 python3 scripts/bench.py --out $OUT/bench_old --contenders tuned flashinfer --rep-ms 30 --shapes $SHAPES > $OUT/bench_old.log 2>&1)
tail -20 $OUT/bench_old.log
timeout 230 python3 -m pytest -q -x tests/test_kernel.py > $OUT/tests.txt 2>&1
tail -15 $OUT/tests.txt
