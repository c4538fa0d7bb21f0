#!/usr/bin/env bash
# The CPU campaign of docs/performance.md, one benchmark after another, each with a hard time limit:
#   bash benchmarks/cpu.sh            # JSON + log (with start and end times) in benchmarks/results/<machine kind>/
#   bash benchmarks/cpu.sh training memory   # only these steps (inference training memory kernels compiled), then
#                                            # the verdict; the log is appended to, not replaced
#   DTYPES=fp32 bash benchmarks/cpu.sh       # fp32 only (default: fp32 bf16), e.g. on a CPU without bf16 hardware
# Needs a python where vitkit and the peers import (make peers: .venv-peers has torch, torchvision, timm,
# transformers, onnxruntime); PYTHON=... chooses another. Ends with the verdict against the performance targets.
set -u
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in .venv-peers/bin/python .venv/bin/python python3; do
    if [ -x "$cand" ] || command -v "$cand" >/dev/null 2>&1; then PY="$cand"; break; fi
  done
fi
case "$PY" in */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;; esac
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
KIND="$(cd benchmarks && "$PY" -c 'from _common import machine_kind; print(machine_kind())')"
OUT="$PWD/benchmarks/results/$KIND"
mkdir -p "$OUT"
LOG="$OUT/cpu.log"
DTYPES="${DTYPES:-fp32 bf16}"
STEPS="${*:-inference training memory kernels compiled}"
for s in $STEPS; do
  case " inference training memory kernels compiled " in *" $s "*) ;; *) echo "cpu.sh: unknown step '$s'" >&2; exit 2 ;; esac
done
want() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
[ $# -eq 0 ] && : > "$LOG"
{
  echo "steps: $STEPS; dtypes: $DTYPES"
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine kind: $KIND"
  $PY -c "import importlib, torch; print('torch', torch.__version__, '|', ', '.join(m + ' ' + importlib.import_module(m).__version__ for m in ('timm', 'torchvision', 'transformers', 'onnxruntime', 'openvino') if importlib.util.find_spec(m)))"
} 2>&1 | tee -a "$LOG"

run() {  # run LIMIT_SECONDS SCRIPT ARGS...: one benchmark with a hard time limit, never the whole campaign
  local limit=$1; shift
  echo "+ python benchmarks/$*" | tee -a "$LOG"
  (cd benchmarks && timeout "$limit" "$PY" "$@") 2>&1 | grep -v -i "warning" | tee -a "$LOG"
}

# 1. ViT-B/16 at 224 inference, fp32 and bf16, batch 16: every library + ONNX Runtime + OpenVINO, GEMM roofline.
want inference && run 1500 inference.py --dtype $DTYPES --batch 16 --repeats 5
# 2. training steps: ViT-S/16 at 224 (batch 16) and the fmnist-demo network (batch 256) vs timm, same AdamW.
want training && run 900 training.py --dtype $DTYPES --repeats 5
# 3. peak memory of one B/16 inference call at batch 64, each library in a fresh process.
want memory && run 900 memory.py --dtype $DTYPES
# 4. the kernel choices (attention, patch embedding, GEMM library, chunk size), both sides of each.
want kernels && run 900 cpu_kernels.py --repeats 3 --seconds 0.3
# 5. torch.compile (inductor, weight freezing): vitkit and the PyTorch libraries, fp32 and bf16 inference, batch 16.
want compiled && run 1800 inference.py --dtype $DTYPES --batch 16 --compile on --peers timm hf torchvision --repeats 5
run 300 verdict.py
echo "done: $(date -u '+%H:%M UTC')" | tee -a "$LOG"
