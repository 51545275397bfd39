# Session 8, h200 host: where `map` spends its extra CPU in the loader (16 workers), against `rows`.
# Run from the repo root on the device: FASTFEED_NO_DALI=1 bash benchmarks/results/2026-12-02-h200-s8/adhoc/map_vs_rows.sh
# (carry .whl, .dali-bench, .devtools with the py-spy binary from .venv-bench/bin).
set -u
D=benchmarks/results/2026-12-02-h200-s8/adhoc
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
source benchmarks/gpu_setup.sh >/dev/null || exit 1
INC=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
SUF=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
gcc -O3 -shared -fPIC -I"$INC" fastfeed/_resize.c -o "fastfeed/_resize$SUF" || exit 1
python3 -c "
import sys; sys.path.insert(0,'benchmarks')
from _common import replicated_sample; from pathlib import Path; import fastfeed
f=replicated_sample(10000, src=Path('.dali-bench/imagenet-sample'))
fastfeed.pack(f, '/tmp/raw10k', store='raw', max_side=500, samples_per_shard=313, workers=16, seed=0)" 2>&1 | tail -1
for mode in map rows map rows; do
  FASTFEED_RAW_READS=$mode taskset -c 0-15 python3 $D/mp_split.py /tmp/raw10k 16 ${EPOCHS:-60} > "$OUT/split_$mode.txt" 2>&1 &
  pid=$!
  sleep 6
  w=$(pgrep -P $pid | head -1)
  if [ ! -f "$OUT/spy_${mode}_worker.txt" ]; then
    .devtools/py-spy record --pid "$w" --duration 5 --rate 250 --format raw -o "$OUT/spy_${mode}_worker.txt" --nonblocking >/dev/null 2>&1 &
    .devtools/py-spy record --pid "$pid" --duration 5 --rate 250 --format raw -o "$OUT/spy_${mode}_main.txt" --nonblocking >/dev/null 2>&1 &
  fi
  wait $pid
  echo "$mode: $(cat "$OUT/split_$mode.txt" | tail -1)"
  cat "$OUT/split_$mode.txt" >> "$OUT/split_all.txt"
done
