set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
SHAPES="H16L4B64Rlong65536x512 H16L4B32Rlognormal16384 H64L4B8Rlognormal16384 H128L4B1C65536 H16L4B1C16384 H8L2B8C2048 H16L4B64C16384"
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
for round in 1 2; do
MLA_VERIFY_COMMIT=slots timeout 150 python3 scripts/bench.py --out $OUT/new$round --contenders tuned --rep-ms 30 --shapes $SHAPES > $OUT/new$round.log 2>&1
tail -9 $OUT/new$round.log
(cd scratch/old && PYTHONPATH=/tmp/site:$PWD MLA_VERIFY_COMMIT=71e6cea timeout 150 python3 scripts/bench.py --out $OUT/old$round --contenders tuned --rep-ms 30 --shapes $SHAPES > $OUT/old$round.log 2>&1)
tail -9 $OUT/old$round.log
done
timeout 200 python3 -m pytest -q -x tests/test_kernel.py -k "merge or gpu" > $OUT/tests.txt 2>&1
tail -4 $OUT/tests.txt
