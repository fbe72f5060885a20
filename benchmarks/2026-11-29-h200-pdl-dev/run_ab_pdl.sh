set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
mkdir -p $OUT; date -u
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider -x > $OUT/gpu_suite.txt 2>&1
echo "gpu suite rc=$?"; tail -3 $OUT/gpu_suite.txt; date -u
SH="H16L2B8C2048 H8L4B8C2048 H64L4B64Rlong65536x512 H16L4B64Rlong65536x512 H16L4B32Rlognormal16384 H64L4B8Rlognormal16384 H128L4B32Rlognormal16384 H8L1B8C16384 H16L4B8C16384 H64L1B8C16384 H128L1B8C2048 H16L4B1C16384 H128L4B64C2048 H16L4B64C16384 H64L4B32C16384 H16L4B32C16384-fp8 H16L4B64Rlong65536x512-fp8"
timeout 330 python3 scratch/ab_pdl.py $SH 2>&1 | grep -v "stale" | tee $OUT/ab_pdl.txt
date -u
