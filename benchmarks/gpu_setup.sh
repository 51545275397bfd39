# Source from the repo root on the lent GPU machine (nvidia-h200) before a GPU benchmark:
#
#     source benchmarks/gpu_setup.sh && python3 benchmarks/dali_gpu.py
#
# That machine has torch + torchvision but no NVIDIA DALI, lmdb or simplejpeg, and no
# package index. Here (once): the DALI cuda130 wheels and their dependencies for Python
# 3.12 are in .whl-dali/, split by ../shared/tools/device-wheels into .devwhl/p01..p05
# (~56 MiB each, one per transfer); lmdb, tqdm and simplejpeg wheels are in .whl/; the
# sample photos are copied to .dali-bench/imagenet-sample (../shared is not sent). All
# three folders are git-ignored, so they travel only when a call names them in `carry`.
#
# The device calls, back to back (a machine idle for 30 s is given back with /tmp/parts):
#   1-4. carry [".devwhl/p0N"]    command: mkdir -p /tmp/parts && cp .devwhl/p0N/part /tmp/parts/p0N
#   5.   carry [".devwhl/p05", ".whl", ".dali-bench"]
#        command: source benchmarks/gpu_setup.sh && python3 benchmarks/dali_gpu.py --json $OUT/dali_gpu.json 2>&1 | tee $OUT/dali_gpu.log
#
# Stages that need no DALI (tokens, tune, s3, loadercpu, roi): export FASTFEED_NO_DALI=1 first
# and send no parts.
#
# What this does: stashes any part present in .devwhl/ into /tmp/parts, joins the parts
# and installs the wheels into /tmp/site (once per machine), installs .whl/*.whl there
# too, puts /tmp/site and the repo on PYTHONPATH, and checks that DALI imports.

_fastfeed_gpu_setup() {
    local site=/tmp/site d n
    if [ -d .devwhl ]; then
        mkdir -p /tmp/parts
        for d in .devwhl/p*/; do
            n=$(basename "$d")
            if [ -f "$d/part" ]; then cp "$d/part" "/tmp/parts/$n" || return 1; fi
        done
    fi
    if [ -z "${FASTFEED_NO_DALI:-}" ] && ! PYTHONPATH=$site python3 -c "import nvidia.dali" >/dev/null 2>&1; then
        if ! ls /tmp/parts/p* >/dev/null 2>&1; then
            echo "gpu_setup: no DALI wheel parts in /tmp/parts: send .devwhl/p01.. first, back to back" >&2
            return 1
        fi
        rm -rf /tmp/devwhl && mkdir -p /tmp/devwhl
        if ! cat /tmp/parts/p* | tar -x -C /tmp/devwhl; then
            echo "gpu_setup: parts in /tmp/parts ($(ls /tmp/parts | tr '\n' ' ')) do not join into the wheel" \
                 "archive; a part is missing (the machine was given back between transfers?): send all again" >&2
            return 1
        fi
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" /tmp/devwhl/*.whl || return 1
    fi
    if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" .whl/*.whl || return 1
    fi
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONUNBUFFERED=1
    if [ -n "${FASTFEED_NO_DALI:-}" ]; then  # stages that need no DALI (tokens, tune, s3, ...)
        python3 -c "import torch; print('gpu_setup: no DALI | torch', torch.__version__, '| cores', len(__import__('os').sched_getaffinity(0)))"
        return $?
    fi
    python3 -c "import nvidia.dali, torch; print('gpu_setup: DALI', nvidia.dali.__version__, '| torch',
torch.__version__, '| GPU', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
'| cores', len(__import__('os').sched_getaffinity(0)))" || return 1
}

_fastfeed_gpu_setup
