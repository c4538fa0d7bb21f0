#!/usr/bin/env bash
# One-shot GPU check, for a session that has a CUDA device (gpu.log records how long it took).
#   bash benchmarks/gpu.sh            # tests, then benchmarks; JSON under benchmarks/results/gpu-*/, log gpu.log
# 1. the CUDA tests (tests/test_cuda.py: inference path = training path in fp32/bf16, a training step,
#    compile), 2. B/16 inference eager fp32/bf16 with MFU against the datasheet peak, 3. compiled, 4. CUDA-graph
#    latency, 5. an S/16 training step vs timm (same fused AdamW), 6. peak memory at batch 64.
# Uses whichever python has a CUDA build of torch (PYTHON=... to choose); vitkit is taken from ./src, so no
# install is needed. Peers (timm, torchvision, transformers) are used where importable, skipped otherwise;
# ONNX Runtime is a CPU peer only.
set -u
cd "$(dirname "$0")/.."
OUT=benchmarks/results
mkdir -p "$OUT"
LOG="$OUT/gpu.log"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in .venv-peers/bin/python python3 python /usr/bin/python3 .venv/bin/python; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
      PY="$cand"; break
    fi
  done
fi
if [ -z "$PY" ]; then echo "no python with a CUDA build of torch found (set PYTHON=...)" | tee "$LOG"; exit 1; fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
VK="$PY -m vitkit"
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  $PY -c "import importlib; [print(m, getattr(importlib.import_module(m), '__version__', '?')) for m in ('timm', 'torchvision', 'transformers') if importlib.util.find_spec(m)]"
} 2>&1 | tee "$LOG"

run() {  # run LIMIT_SECONDS ARGS...: one step with a hard time limit, never the whole script
  local limit=$1; shift
  echo "+ $*" | tee -a "$LOG"
  timeout "$limit" "$@" 2>&1 | grep -v Warning | tee -a "$LOG"
}

run 180 $PY -m pytest -q tests/test_cuda.py
run 150 $VK bench B/16 --device cuda --dtype bf16 fp32 --batch 64 256 --what inference --repeats 10 --warmup 3 \
    --peers timm hf torchvision --out "$OUT/gpu-inference"
run 150 $VK bench B/16 --device cuda --dtype bf16 --batch 256 --what inference --compile on --peers timm \
    --repeats 10 --warmup 3 --no-roofline --out "$OUT/gpu-compiled"
run 90 $VK bench B/16 --device cuda --dtype bf16 --what latency --compile on --compile-mode reduce-overhead \
    --peers timm --repeats 20 --warmup 3 --no-roofline --out "$OUT/gpu-latency-cudagraphs"
run 90 $VK bench S/16 --device cuda --dtype bf16 --what train --train-batch 128 --peers timm --repeats 10 --warmup 3 \
    --out "$OUT/gpu-train"
run 60 $VK bench B/16 --device cuda --dtype bf16 --what memory --memory-batch 64 --peers timm hf torchvision \
    --out "$OUT/gpu-memory"
echo "done: $(date -u '+%H:%M UTC'); results under $OUT/gpu-*" | tee -a "$LOG"
