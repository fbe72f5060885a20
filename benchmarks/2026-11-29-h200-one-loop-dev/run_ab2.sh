set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
NCU=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
mkdir -p $OUT/r
timeout 300 python3 scratch/ab_vars.py cur var_simple var_simple2 > $OUT/r/ab_vars.txt 2>&1
tail -15 $OUT/r/ab_vars.txt
for who in ours:var_simple2 fi; do shape=H128L4B32C16384
  tag=${who#ours:}_${shape}
  timeout 150 $NCU --clock-control none --profile-from-start off --set full --import-source no \
    -o $OUT/r/$tag python3 scratch/prof_one.py $who $shape > $OUT/r/ncu_$tag.log 2>&1
  echo "$tag rc=$?"
  $NCU --import $OUT/r/$tag.ncu-rep --page details --csv > $OUT/r/${tag}_details.csv 2>&1
  $NCU --import $OUT/r/$tag.ncu-rep --page raw --csv > $OUT/r/${tag}_raw.csv 2>&1
  $NCU --import $OUT/r/$tag.ncu-rep --page source --print-source sass --csv > $OUT/r/${tag}_sass.csv 2>&1
  ls -la $OUT/r/${tag}_sass.csv; head -c 300 $OUT/r/${tag}_sass.csv; echo
done
cd $OUT && tar czf r.tgz r && rm -rf r && ls -la
