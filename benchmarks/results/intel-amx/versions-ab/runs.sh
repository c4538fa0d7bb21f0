PY=/work/main/.venv-peers/bin/python
for round in 1 2; do
for v in old main; do
  cd /work/$v/benchmarks
  echo "== $v round $round inference $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
  PYTHONPATH=../src timeout 900 $PY inference.py --dtype fp32 bf16 --batch 16 --repeats 5 --peers torchvision timm --out /tmp/ab/$v-inf-$round 2>&1 | grep -E "^  (vitkit|timm|torchvision) |vitkit 0.1.0" | cut -c1-120
done; done
for v in old main; do
  cd /work/$v/benchmarks
  echo "== $v training $(date -u +%H:%M:%S)"
  PYTHONPATH=../src timeout 900 $PY training.py --dtype fp32 bf16 --repeats 5 --peers timm --out /tmp/ab/$v-train 2>&1 | grep -E "^  (vitkit|timm) " | cut -c1-120
done
echo done $(date -u +%H:%M:%S)
