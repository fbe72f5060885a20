set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
NCU=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
# A/B first: the simplified score loop against the shipped one.
timeout 240 python3 scratch/ab_simple.py > $OUT/ab_simple.txt 2>&1
tail -15 $OUT/ab_simple.txt
for who in ours fi; do for shape in H128L4B32C16384 H128L4B64C2048; do
  tag=${who}_${shape}
  timeout 150 $NCU --clock-control none --profile-from-start off --set full --import-source no \
    -o $OUT/$tag python3 scratch/prof_one.py $who $shape > $OUT/ncu_$tag.log 2>&1
  echo "$tag rc=$?"; tail -2 $OUT/ncu_$tag.log
  $NCU --import $OUT/$tag.ncu-rep --page details --csv > $OUT/${tag}_details.csv 2>&1
  $NCU --import $OUT/$tag.ncu-rep --page raw --csv > $OUT/${tag}_raw.csv 2>&1
  grep -E '"(Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Registers Per Thread|Grid Size|L2 Hit Rate)"' $OUT/${tag}_details.csv | awk -F'","' '{print $5, "|", $(NF-2), $(NF-1), $NF}' | head -24
done; done
rm -f $OUT/*.ncu-rep.tmp
ls -la $OUT
