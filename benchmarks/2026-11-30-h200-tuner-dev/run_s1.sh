set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; date -u; nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
timeout 200 python3 scratch/ab.py head=mla_verify_head,tree=mla_verify_tree,s1c=mla_verify_s1c,s2c=mla_verify_s2c,w3=mla_verify_w3 H8L1B1C16384 H32L1B64C2048 H16L4B64C2048 H128L1B8C2048 H16L1B8C2048 H8L2B8C2048 H16L4B1C16384 2>&1 | grep -v stale | tee $OUT/ab_uniform.txt
date -u
timeout 120 python3 scratch/ab.py head=mla_verify_head,tree=mla_verify_tree H64L4B64Rlong65536x512 H16L4B32Rlognormal16384 H128L4B64C2048 H16L4B8C16384 H16L4B64Rlong65536x512-fp8 2>&1 | grep -v stale | tee $OUT/ab_ragged.txt
date -u
timeout 200 python3 scratch/tuner_noise.py 2>&1 | grep -v stale | tee $OUT/tuner_noise.txt
date -u
