#!/usr/bin/env bash
# One-shot GPU check, for a session that has a CUDA device (gpu.log records how long it took).
#   bash benchmarks/gpu.sh            # tests, then benchmarks; JSON under benchmarks/results/<kind>/gpu-*/, log gpu.log
#   bash benchmarks/gpu.sh tests inference memory   # only these steps (tests inference compiled latency train memory)
# <kind> is the GPU's name in lower case with dashes (nvidia-h200). The step limits add up to 500 s, so the whole
# check fits one 10-minute lease call with the machine's start; a step that fails prints its traceback (--debug)
# and the next one runs.
# 1. the CUDA tests (tests/test_cuda.py: inference path = training path in fp32/bf16, a training step,
#    compile), 2. B/16 inference eager fp32/bf16 with MFU against the datasheet peak, 3. compiled, 4. CUDA-graph
#    latency, 5. an S/16 training step vs timm (same fused AdamW), 6. peak memory at batch 64.
# Uses whichever python has a CUDA build of torch (PYTHON=... to choose); vitkit is taken from ./src, so no
# install is needed. Peers (timm, torchvision, transformers) are used where importable, skipped otherwise;
# ONNX Runtime is a CPU peer only.
set -u
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in .venv-peers/bin/python python3 python /usr/bin/python3 .venv/bin/python; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
      PY="$cand"; break
    fi
  done
fi
if [ -z "$PY" ]; then echo "no python with a CUDA build of torch found (set PYTHON=...)"; exit 1; fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
KIND=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr 'A-Z ' 'a-z-')
OUT=benchmarks/results/${KIND:-gpu}
mkdir -p "$OUT"
LOG="$OUT/gpu.log"
VK="$PY -m vitkit"
export PYTHONUNBUFFERED=1
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  $PY -c "import importlib; [print(m, getattr(importlib.import_module(m), '__version__', '?')) for m in ('timm', 'torchvision', 'transformers') if importlib.util.find_spec(m)]"
  echo "steps: ${*:-all}"
} 2>&1 | tee -a "$LOG"

STEPS=" ${*:-tests inference compiled latency train memory} "
run() {  # run STEP LIMIT_SECONDS ARGS...: one step (if chosen) with a hard time limit, never the whole script
  local step=$1 limit=$2; shift 2
  case "$STEPS" in *" $step "*) ;; *) return 0 ;; esac
  echo "+ $*" | tee -a "$LOG"
  timeout "$limit" "$@" 2>&1 | grep -v Warning | tee -a "$LOG"
}

run tests 120 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py
run inference 100 $VK bench B/16 --device cuda --dtype bf16 fp32 --batch 64 256 --what inference --repeats 10 --warmup 3 \
    --peers timm hf torchvision --debug --out "$OUT/gpu-inference"
run compiled 90 $VK bench B/16 --device cuda --dtype bf16 --batch 256 --what inference --compile on --peers timm \
    --repeats 10 --warmup 3 --no-roofline --debug --out "$OUT/gpu-compiled"
run latency 50 $VK bench B/16 --device cuda --dtype bf16 --what latency --compile on --compile-mode reduce-overhead \
    --peers timm --repeats 20 --warmup 3 --no-roofline --debug --out "$OUT/gpu-latency-cudagraphs"
run train 50 $VK bench S/16 --device cuda --dtype bf16 --what train --train-batch 128 --peers timm --repeats 10 --warmup 3 \
    --debug --out "$OUT/gpu-train"
run memory 90 $VK bench B/16 --device cuda --dtype bf16 --what memory --memory-batch 64 --peers timm hf torchvision \
    --debug --out "$OUT/gpu-memory"
echo "done: $(date -u '+%H:%M UTC'); results under $OUT/gpu-*" | tee -a "$LOG"
