#!/usr/bin/env bash
# GPU benchmark stages for the lent nvidia-h200-x2 machine (2 GPUs, 32 cores), run from the repo
# root after the DALI wheel parts were sent (benchmarks/gpu_setup.sh explains the transfers):
#
#   bash benchmarks/gpu_runs.sh dali      # issue 6: benchmarks/dali_gpu.py on GPU 0, 16 cores
#   bash benchmarks/gpu_runs.sh scaling   # issue 8: image workload on 1 and 2 GPUs
#   bash benchmarks/gpu_runs.sh tokens    # issues 4/10/8: ddp_tokens on 2 GPUs, token scaling 1 -> 2
#   bash benchmarks/gpu_runs.sh tune      # issue 5: grid vs fastfeed tune, CPU decode, 16 cores
#
# Logs and JSON go to $OUT (the device tool's output folder) or ./gpu-out.
set -uo pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
source benchmarks/gpu_setup.sh || exit 1
CORES16="0-15"
stage=${1:?stage: dali|scaling|tokens|tune|s3|loadercpu}
case "$stage" in
dali)
  taskset -c $CORES16 python3 benchmarks/dali_gpu.py --json "$OUT/dali_gpu.json" ${DALI_ARGS:-} 2>&1 | tee "$OUT/dali_gpu.log" ;;
scaling)
  D=/tmp/scaling-data
  [ -f $D/shards/index.json ] || python3 benchmarks/scaling.py prepare --source .dali-bench/imagenet-sample \
      --data $D --replicate ${REPLICATE:-8192} --pack-workers 16 2>&1 | tail -2
  for n in 1 2; do
    for p in ${PIPELINES:-fastfeed-dali fastfeed-cpu imagefolder}; do
      torchrun --nproc-per-node $n benchmarks/scaling.py image --data $D --pipeline $p \
        --global-batch ${GLOBAL_BATCH:-512} --steps ${STEPS:-30} --warmup 6 --json "$OUT/scal_${p}_$n.json" \
        2>&1 | grep -v "^W1\|OMP_NUM_THREADS\|^\*\*\*" | tail -3 | cut -c1-400
    done
  done
  python3 benchmarks/scaling.py summary "$OUT"/scal_*.json 2>&1 | tee "$OUT/scaling.txt" ;;
tokens)
  torchrun --nproc-per-node 2 benchmarks/ddp_tokens.py --steps ${TOKEN_STEPS:-200} --json "$OUT/ddp_tokens.json" \
      ${TOKEN_ARGS:-} 2>&1 | grep -v "^W1\|OMP_NUM_THREADS\|^\*\*\*" | tee "$OUT/ddp_tokens.log"
  if [ -n "${TOKEN_SCALING:-1}" ]; then
    for n in 1 2; do
      torchrun --nproc-per-node $n benchmarks/scaling.py tokens --global-budget 32768 --steps 60 \
        --json "$OUT/scaltok_$n.json" 2>&1 | grep -v "^W1\|OMP_NUM_THREADS\|^\*\*\*" | tail -6
    done
    python3 benchmarks/scaling.py summary "$OUT"/scaltok_*.json 2>&1 | tee "$OUT/scaling_tokens.txt"
  fi ;;
tune)
  taskset -c $CORES16 python3 benchmarks/tune.py --images ${TUNE_IMAGES:-6000} --per-trial 1.5 \
      --prefetch ${TUNE_PREFETCH:-1,2,4,8} --deadline 420 --json "$OUT/tune-h200.json" 2>&1 | tee "$OUT/tune.log"
  taskset -c $CORES16 python3 benchmarks/decode_per_core.py --images 512 --repeat 3 2>&1 | tail -15 | tee "$OUT/decode_per_core.log" ;;
s3)
  # issue 3 on 16 cores (CPU only): shards on S3 (moto on 127.0.0.1) vs one GET per image. Needs the
  # S3 wheels (.whl-s3, cp312) sent first: carry [".whl-s3"], command: cp -r .whl-s3 /tmp/whl-s3
  W=/tmp/whl-s3; [ -d .whl-s3 ] && W=.whl-s3
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-s3 "$W"/*.whl || exit 1
  PYTHONPATH=/tmp/site-s3:$PYTHONPATH taskset -c ${S3_CORES:-16-31} python3 benchmarks/loader_s3.py \
      --images ${S3_IMAGES:-8000} --workers 14 --batch 128 --io-only --repeat ${S3_REPEAT:-2} \
      --min-time 4 --max-time 15 --data /tmp/s3-bench --json "$OUT/loader_s3.json" 2>&1 | tail -40 | tee "$OUT/loader_s3.log" ;;
loadercpu)
  # issue 3 on 16 cores: fastfeed vs torchvision ImageFolder (PIL and torchvision.io) and webdataset,
  # 14 workers each, generated ImageNet-like JPEGs (FFCV is not installable there; it is measured on python).
  W=/tmp/whl-s3; [ -d .whl-s3 ] && W=.whl-s3
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-wds \
      "$W"/webdataset-*.whl "$W"/braceexpand-*.whl "$W"/pyyaml-*.whl || exit 1
  PYTHONPATH=/tmp/site-wds:$PYTHONPATH taskset -c ${LC_CORES:-0-15} python3 benchmarks/loader_cpu.py --datasets synth \
      --peers fastfeed,imagefolder,imagefolder-tvio,webdataset --caches warm --workers 14 --time 10 \
      --repeat ${LC_REPEAT:-2} --json "$OUT/loader_cpu.json" 2>&1 | tail -40 | tee "$OUT/loader_cpu.log" ;;
*) echo "unknown stage $stage" >&2; exit 2 ;;
esac
