#!/usr/bin/env bash
# GPU benchmark stages for the lent nvidia-h200-x2 machine (2 GPUs, 32 cores), run from the repo
# root after the DALI wheel parts were sent (benchmarks/gpu_setup.sh explains the transfers):
#
#   bash benchmarks/gpu_runs.sh dali      # issues 6/20: benchmarks/dali_gpu.py on GPU 0, 16 cores: the paired
#                                         #   search, then fastfeed num_pipelines 1 and 2 next to one and two
#                                         #   hand-written pipelines (ratios vs the best single hand-written one),
#                                         #   and the time to the first batch (cold, resume, adopted) on the resized
#                                         #   shards (~6-7 min; DALI_ARGS="--datasets resized" ~4 min)
#   bash benchmarks/gpu_runs.sh scaling   # issue 8: image workload on 1 and 2 GPUs
#   bash benchmarks/gpu_runs.sh tokens    # issues 4/10/8: ddp_tokens on 2 GPUs, token scaling 1 -> 2 (~4.5 min)
#   bash benchmarks/gpu_runs.sh gputokens # issue 19: one GPU, 12x1024 transformer step on packed seq_len rows
#                                         #   (varlen attention) vs padded vs token-budget batches (gpu_tokens.py, ~2-3 min)
#   bash benchmarks/gpu_runs.sh tune      # issue 5: grid vs fastfeed tune, CPU decode, 16 cores (~7 min)
#   bash benchmarks/gpu_runs.sh dalivar   # issue 6: DALI decoder options one at a time (dali_variants.py, ~2 min)
#   bash benchmarks/gpu_runs.sh roi       # issue 3: build fastfeed/_jpegroi there, per-core decode (~1.5 min)
#   bash benchmarks/gpu_runs.sh raw       # issue 20: raw-pixel shards vs JPEG on 16 cores, raw pixels read
#                                         #   through the map and as rows (loader_raw.py; builds _jpegroi and
#                                         #   _resize), then resize_kernel.py on one core (~5 min)
#   bash benchmarks/gpu_runs.sh dalibuild # issue 20: what a first Pipeline.build() costs, per variant (~1 min)
#   bash benchmarks/gpu_runs.sh trainstep # ResNet-18/50 training steps fed by ImageFolder, fastfeed's defaults,
#                                         #   after tune, DALI: img/s and the data-wait share (train_step.py, ~6 min;
#                                         #   TRAIN_ARGS to narrow it, e.g. "--model resnet18 --feeders fastfeed,dali")
#   bash benchmarks/gpu_runs.sh monitor   # the step monitor's overhead on ResNet-50 and its cross-check against
#                                         #   torch.profiler, CPU decode with 2 workers and DALI (~4 min)
#
# Logs and JSON go to $OUT (the device tool's output folder) or ./gpu-out.
set -uo pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
source benchmarks/gpu_setup.sh || exit 1
CORES16=${CORES16:-0-15}  # the cores of the 16-core stages (dali, dalivar, tune, roi)
stage=${1:?stage: dali|dalivar|scaling|tokens|gputokens|tune|s3|loadercpu|roi|raw|dalibuild|trainstep|monitor}
_build_ext() {  # fastfeed/_jpegroi and fastfeed/_resize for this Python, as `pip install .` builds them
  local INC SUF
  INC=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  SUF=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  [ -f "fastfeed/_jpegroi$SUF" ] || gcc -O2 -shared -fPIC -I"$INC" fastfeed/_jpegroi.c -ljpeg -o "fastfeed/_jpegroi$SUF"
  [ -f "fastfeed/_resize$SUF" ] || gcc -O3 -shared -fPIC -I"$INC" fastfeed/_resize.c -o "fastfeed/_resize$SUF"
}
case "$stage" in
dali)
  taskset -c $CORES16 python3 benchmarks/dali_gpu.py --json "$OUT/dali_gpu.json" ${DALI_ARGS:-} 2>&1 | tee "$OUT/dali_gpu.log"
  # the summary lines again at the end (the device tool returns the log's tail)
  awk '/^-- /{print} /\(A-B-B-A\)/{print} /one or two pipelines/,/best setting:/{print}' "$OUT/dali_gpu.log" \
      | tee "$OUT/dali_summary.txt" ;;
dalivar)
  taskset -c $CORES16 python3 benchmarks/dali_variants.py --json "$OUT/dali_variants.json" ${DALIVAR_ARGS:-} 2>&1 \
      | tee "$OUT/dali_variants.log" ;;
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
  # issues 4/10: all configurations on 2 GPUs (its ds-fixed/ff-tokens/ff-bucket rows are also the 2-GPU
  # leg of issue 8's token scaling), then the same global budget on 1 GPU; GPU clocks sampled throughout.
  # ~4.5 min on h200-x2 (6.5 at worst); TOKEN_STEPS, TOKEN_ARGS, TOKEN_SCALING=0, TOKEN_SCALING_STEPS.
  SMI=""
  if command -v nvidia-smi >/dev/null; then
    R=clocks_event_reasons.active
    nvidia-smi --query-gpu=$R --format=csv >/dev/null 2>&1 || R=clocks_throttle_reasons.active
    nvidia-smi --query-gpu=timestamp,index,clocks.sm,temperature.gpu,power.draw,$R --format=csv,noheader,nounits \
      -lms 500 > "$OUT/tokens_gpu.csv" 2>/dev/null & SMI=$!
  fi
  torchrun --nproc-per-node 2 benchmarks/ddp_tokens.py --steps ${TOKEN_STEPS:-120} --json "$OUT/ddp_tokens.json" \
      ${TOKEN_ARGS:-} 2>&1 | grep -v "^W1\|OMP_NUM_THREADS\|^\*\*\*\|^RESULT" | tee "$OUT/ddp_tokens.log"
  if [ "${TOKEN_SCALING:-1}" != 0 ]; then
    torchrun --nproc-per-node 1 benchmarks/scaling.py tokens --global-budget 32768 --steps ${TOKEN_SCALING_STEPS:-60} \
      --json "$OUT/scaltok_1.json" 2>&1 | grep -v "^W1\|OMP_NUM_THREADS\|^\*\*\*\|^{\|^RESULT" | tee "$OUT/scaltok_1.log" | tail -12
    python3 benchmarks/scaling.py summary "$OUT/scaltok_1.json" "$OUT/ddp_tokens.json" 2>&1 | tee "$OUT/scaling_tokens.txt"
  fi
  if [ -n "$SMI" ]; then kill "$SMI"; python3 benchmarks/scaling.py clocks "$OUT/tokens_gpu.csv" | tee "$OUT/tokens_gpu.txt"; fi ;;
gputokens)
  # issue 19 on GPU 0 (any kind; FASTFEED_NO_DALI=1, no parts to send): builds 30,000 token documents and packs
  # them under /tmp (~10 s), then packed / padded / budget / budget-varlen, 1.5M real tokens each; GPU_TOKENS_ARGS.
  CUDA_VISIBLE_DEVICES=${GPU_TOKENS_GPU:-0} python3 benchmarks/gpu_tokens.py --json "$OUT/gpu_tokens.json" \
      ${GPU_TOKENS_ARGS:-} 2>&1 | tee "$OUT/gpu_tokens.log" | grep -v "^RESULT\|^W1\|UserWarning" ;;
tune)
  # ~7 min on 16 cores: 24,000 JPEGs generated + packed (~0.5 min), tune (60 s budget, its
  # confirmation included), grid workers 0..24 x prefetch 1,2,4,8 (97 settings, ~4-5 min),
  # confirmation of tuned / grid's two best / num_workers=0 (3 interleaved rounds, ~1 min).
  # The grid stops at --deadline (then no figures: "grid incomplete").
  taskset -c $CORES16 python3 benchmarks/tune.py --deadline ${TUNE_DEADLINE:-500} ${TUNE_ARGS:-} \
      --json "$OUT/tune-h200.json" 2>&1 | tee "$OUT/tune.log"
  if [ -n "${DECODE_PER_CORE:-}" ]; then  # issue 3's per-core figure (recorded already); ~0.5 min
    taskset -c $CORES16 python3 benchmarks/decode_per_core.py --images 512 --repeat 3 2>&1 | tail -15 \
      | tee "$OUT/decode_per_core.log"
  fi ;;
s3)
  # issue 3 on 16 cores (CPU only): shards on S3 (moto on 127.0.0.1) vs one GET per image. Needs the
  # S3 wheels (.whl-s3, cp312) sent first: carry [".whl-s3"], command: cp -r .whl-s3 /tmp/whl-s3
  # Build .whl-s3 here (git-ignored) from the dev venv's versions, ~34 MB:
  #   .venv/bin/pip freeze | grep -iE '^(aiobotocore|aiohappyeyeballs|aiohttp|aioitertools|aiosignal|attrs|blinker|
  #     boto3|botocore|braceexpand|certifi|cffi|charset-normalizer|click|cryptography|Flask|flask-cors|frozenlist|
  #     fsspec|idna|itsdangerous|Jinja2|jmespath|MarkupSafe|moto|multidict|propcache|py-partiql-parser|pycparser|
  #     python-dateutil|PyYAML|requests|responses|s3fs|s3transfer|six|urllib3|webdataset|Werkzeug|wrapt|xmltodict|
  #     yarl|typing_extensions|jsonpath-ng)==' > /tmp/s3req.txt   (one line)
  #   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  #     --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  #     --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 -d .whl-s3 -r /tmp/s3req.txt
  W=/tmp/whl-s3; [ -d .whl-s3 ] && W=.whl-s3
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-s3 "$W"/*.whl || exit 1
  PYTHONPATH=/tmp/site-s3:$PYTHONPATH taskset -c ${S3_CORES:-16-31} python3 benchmarks/loader_s3.py \
      --images ${S3_IMAGES:-8000} --workers 14 --batch 128 --io-only --repeat ${S3_REPEAT:-2} \
      --min-time 4 --max-time 15 --data /tmp/s3-bench --json "$OUT/loader_s3.json" 2>&1 | tee "$OUT/loader_s3.log" ;;
loadercpu)
  # issue 3 on 16 cores: fastfeed vs torchvision ImageFolder (PIL and torchvision.io) and webdataset,
  # 14 workers each, generated ImageNet-like JPEGs (FFCV is not installable there; it is measured on python).
  # Run the roi stage first (region decoding); LC_ARGS=--jpeg-restarts for restart-marker shards.
  W=/tmp/whl-s3; [ -d .whl-s3 ] && W=.whl-s3
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-wds \
      "$W"/webdataset-*.whl "$W"/braceexpand-*.whl "$W"/pyyaml-*.whl || exit 1
  PYTHONPATH=/tmp/site-wds:$PYTHONPATH taskset -c ${LC_CORES:-0-15} python3 benchmarks/loader_cpu.py --datasets synth \
      --peers fastfeed,imagefolder,imagefolder-tvio,webdataset --caches warm --workers 14 --time 10 \
      --repeat ${LC_REPEAT:-2} ${LC_ARGS:-} --json "$OUT/loader_cpu.json" 2>&1 | tee "$OUT/loader_cpu.log" ;;
roi)
  # issue 3: region-of-interest JPEG decoding. Builds the optional C extension fastfeed/_jpegroi in place
  # for this python (needs gcc, jpeglib.h and Python.h; without them the loader decodes whole images and
  # the line below says so), then the per-core decode figures with it (fastfeed-turbo) and without it
  # (fastfeed-turbo-full), 16 cores idle. ~1.5 min. Run it before tune/scaling/loadercpu on the same
  # machine and those use the extension too (the .so stays in the tree there; it is git-ignored).
  INC=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  SUF=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  gcc -O2 -shared -fPIC -I"$INC" fastfeed/_jpegroi.c -ljpeg -o "fastfeed/_jpegroi$SUF" 2>&1 | tail -3 | tee "$OUT/roi_build.log"
  gcc -O3 -shared -fPIC -I"$INC" fastfeed/_resize.c -o "fastfeed/_resize$SUF" 2>&1 | tail -3 | tee -a "$OUT/roi_build.log"
  python3 -c "from fastfeed.decode import roi; print('region decoding built:', roi.available())" 2>&1 | tee -a "$OUT/roi_build.log"
  taskset -c $CORES16 python3 benchmarks/decode_per_core.py --images 512 --repeat 3 2>&1 | tail -12 | tee "$OUT/decode_per_core_roi.log" ;;
raw)
  # issue 20 on 16 cores (no GPU work; FASTFEED_NO_DALI=1 is enough): the JPEG side needs the region
  # decoder, so _jpegroi is built first, as in the roi stage. RAW_ARGS for other sizes.
  INC=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  SUF=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  [ -f "fastfeed/_jpegroi$SUF" ] || gcc -O2 -shared -fPIC -I"$INC" fastfeed/_jpegroi.c -ljpeg -o "fastfeed/_jpegroi$SUF"
  [ -f "fastfeed/_resize$SUF" ] || gcc -O3 -shared -fPIC -I"$INC" fastfeed/_resize.c -o "fastfeed/_resize$SUF"
  taskset -c $CORES16 python3 benchmarks/loader_raw.py --source .dali-bench/imagenet-sample \
      --peers ${RAW_PEERS:-fastfeed-raw-map,fastfeed-raw-rows,fastfeed-jpeg} \
      ${RAW_ARGS:---images 10000 --workers 16 --batch-size 128 --time 8 --repeat 1} \
      --json "$OUT/loader_raw.json" 2>&1 | tee "$OUT/loader_raw.log" | grep -v "^RESULT"
  # the bilinear step alone, one core: fastfeed._resize vs OpenCV (from the page cache and hot)
  taskset -c 0 python3 benchmarks/resize_kernel.py --source .dali-bench/imagenet-sample --images 2000 \
      --json "$OUT/resize_kernel.json" 2>&1 | tee "$OUT/resize_kernel.log" | tail -8 ;;
dalibuild)
  taskset -c $CORES16 python3 benchmarks/dali_build.py --images .dali-bench/imagenet-sample \
      --json "$OUT/dali_build.json" 2>&1 | tee "$OUT/dali_build.log" ;;
trainstep)
  _build_ext
  FASTFEED_BENCH_DATA=${FASTFEED_BENCH_DATA:-/tmp/bench-data} python3 benchmarks/run.py train_step --window 100:250 \
      ${TRAIN_ARGS:-} --json "$OUT/train_step.json" 2>&1 | tee "$OUT/train_step.log" | grep -v "^RESULT" ;;
monitor)
  _build_ext
  python3 benchmarks/run.py monitor_overhead --model resnet50 --device cuda --repeat 5 \
      --json "$OUT/monitor_overhead.json" 2>&1 | tee "$OUT/monitor_overhead.log" | grep -v "^RESULT" | tail -12
  python3 benchmarks/run.py monitor_overhead --model resnet50 --device cuda --data synth --workers 2 --steps 60 \
      --repeat 3 --profile --json "$OUT/monitor_cpu2.json" 2>&1 | tee "$OUT/monitor_cpu2.log" | grep -v "^RESULT" | tail -10
  python3 benchmarks/run.py monitor_overhead --model resnet50 --device cuda --data synth --decode dali --steps 60 \
      --repeat 3 --profile --json "$OUT/monitor_dali.json" 2>&1 | tee "$OUT/monitor_dali.log" | grep -v "^RESULT" | tail -10 ;;
*) echo "unknown stage $stage" >&2; exit 2 ;;
esac
