set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
rm -f configs/sm90.json
timeout 470 python3 -m mla_verify.tune --out configs --time-limit 400 > $OUT/tune.log 2>&1
echo "tune rc $?"; cp configs/sm90.json $OUT/; tail -8 $OUT/tune.log
SHAPES="H8L2B64C65536 H8L2B8C2048 H16L4B64C16384 H16L4B32Rlognormal16384 H16L4B64Rlong65536x512 H16L4B1C16384 H64L4B32C16384 H64L4B8Rlognormal16384 H128L2B32C16384 H128L4B32C16384 H128L4B1C65536 H128L4B64C2048 H16L4B32C16384"
MLA_VERIFY_COMMIT=8539cd9 timeout 110 python3 scripts/bench.py --out $OUT/bench --contenders tuned default flashinfer --rep-ms 30 --shapes $SHAPES > $OUT/bench.log 2>&1
grep -A17 "^shape " $OUT/bench.log
