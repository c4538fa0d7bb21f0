#!/usr/bin/env bash
# The CPU campaign of docs/performance.md (issue 6), one benchmark after another, each with a hard time limit:
#   bash benchmarks/cpu.sh [CHECKPOINT]      # about 25 minutes on a 2-core CPU; log in benchmarks/results/cpu.log
# Needs a python where vitkit and the peers import (make peers: .venv-peers has torch + torchvision + timm +
# transformers); PYTHON=... chooses another. CHECKPOINT (default runs/demo/model, from `make demo`) is the
# trained Fashion-MNIST model whose accuracy int8 quantisation is measured on.
#
# Settings are chosen for what a CPU without bf16 instructions (AVX2) can finish: there torch's bf16 GEMM is a
# generic loop (~0.6 GFLOP/s per core against ~40 in fp32), so a peer in bf16 needs about a minute per ViT-B/16
# image. bf16 rows therefore use batch 1 (inference) or small batches (training) and a single timed repeat for
# every contender, and peak memory at batch 64 is measured in fp32 only.
set -u
cd "$(dirname "$0")/.."
OUT="$PWD/benchmarks/results"
mkdir -p "$OUT"
LOG="$OUT/cpu.log"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in .venv-peers/bin/python /work/peers/bin/python .venv/bin/python python3; do
    if [ -x "$cand" ] || command -v "$cand" >/dev/null 2>&1; then PY="$cand"; break; fi
  done
fi
case "$PY" in */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;; esac
CKPT="$(realpath -m "${1:-runs/demo/model}")"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  $PY -c "import importlib, torch; print('torch', torch.__version__, '|', ', '.join(m + ' ' + importlib.import_module(m).__version__ for m in ('timm', 'torchvision', 'transformers') if importlib.util.find_spec(m)))"
} 2>&1 | tee "$LOG"

run() {  # run LIMIT_SECONDS SCRIPT ARGS...: one benchmark with a hard time limit, never the whole campaign
  local limit=$1; shift
  echo "+ python benchmarks/$*" | tee -a "$LOG"
  (cd benchmarks && timeout "$limit" "$PY" "$@") 2>&1 | grep -v -i "warning" | tee -a "$LOG"
}

# 1. ViT-B/16 at 224 inference, fp32: every library at batch 8 and 32, latency at batch 1, GEMM roofline.
run 900 inference.py --dtype fp32 --batch 8 32 --repeats 5
# 2. the same in bf16 (batch 1, one timed repeat: see above).
run 900 inference.py --dtype bf16 --batch 1 --repeats 1 --warmup 0 --no-latency
# 3. peak memory of one B/16 inference call at batch 64, each library in a fresh process (fp32).
run 600 memory.py --dtype fp32
# 4. training steps: ViT-S/16 at 224 (batch 16) and the Fashion-MNIST model (batch 256) vs timm, fp32 ...
run 600 training.py --dtype fp32 --repeats 3
# ... and bf16 autocast (timm's bf16 step takes about a minute at S/16 batch 4).
run 600 training.py --models S/16 --batch 4 --dtype bf16 --repeats 1 --warmup 0 --out "$OUT/training-bf16"
run 600 training.py --models recipe:fmnist-demo --batch 256 --dtype bf16 --repeats 2 --out "$OUT/training-bf16"
# 5. Figure 12: throughput against input size, S/16 and B/16, vitkit vs timm and Hugging Face.
run 900 figure12.py --img-size 64 128 224 384 512 --repeats 2
# 6. int8 dynamic quantisation: accuracy change on Fashion-MNIST (trained model) and speed on B/16.
if [ -f "$CKPT/vitkit.json" ]; then run 600 int8.py --checkpoint "$CKPT" --repeats 3; fi
echo "done: $(date -u '+%H:%M UTC')" | tee -a "$LOG"
