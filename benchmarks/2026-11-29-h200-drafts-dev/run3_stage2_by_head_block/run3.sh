set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
SHAPES="H16L4B64Rlong65536x512 H16L4B32Rlognormal16384 H64L4B8Rlognormal16384 H16L4B32C16384 H128L4B64C2048 H8L2B8C2048 H16L4B1C16384 H128L4B32C16384"
for v in "4 1" "8 1" "8 2" "8 4"; do
  set -- $v
  timeout 100 python3 scratch/merge_variant.py $1 $2 --out $OUT/w$1u$2 --contenders tuned flashinfer --rep-ms 30 --shapes $SHAPES > $OUT/w$1u$2.log 2>&1
  echo "== merge warps $1 unroll $2"; grep -A10 "^shape " $OUT/w$1u$2.log | head -10
done
(cd scratch/old && PYTHONPATH=/tmp/site:$PWD timeout 100 python3 scripts/bench.py --out $OUT/old --contenders tuned flashinfer --rep-ms 30 --shapes $SHAPES > $OUT/old.log 2>&1)
echo "== c391c0b (per-head stage 2)"; grep -A10 "^shape " $OUT/old.log | head -10
timeout 200 python3 -m pytest -q -x tests/test_kernel.py -k "gpu" > $OUT/tests.txt 2>&1; tail -3 $OUT/tests.txt
