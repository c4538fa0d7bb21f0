#!/usr/bin/env bash
# Regenerate every figure of docs/analysis.md from one checkpoint (any format vitkit reads).
#   bash docs/figures/analysis/make_figures.sh runs/demo/model
# `make analysis-figures` runs it on the default run of `make demo` (runs/demo/model); which model
# made the committed figures is said in docs/analysis.md.
set -euo pipefail
CKPT=${1:?usage: make_figures.sh CHECKPOINT}
HERE=$(cd "$(dirname "$0")" && pwd)
VITKIT=${VITKIT:-vitkit}
PY=${PY:-python}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# Figures 6 and 7 on Fashion-MNIST test images (attention distance over 128 of them, as the paper)
$VITKIT analyze "$CKPT" --data fashion-mnist --num-images 128 --rollout-images 10 --out "$TMP/fmnist"
for f in rollout attention_distance posemb_similarity embedding_filters; do
  cp "$TMP/fmnist/$f.png" "$HERE/fmnist_$f.png"
done
cp "$TMP/fmnist/summary.json" "$HERE/fmnist_summary.json"
cp "$TMP/fmnist/attention_distance.json" "$HERE/fmnist_attention_distance.json"

# real photos from scikit-image, analysed at 112 px (the position embeddings resized to a 16x16 grid)
$PY - "$TMP/photos" <<'PYEOF'
import sys, pathlib
from PIL import Image
import skimage.data as d
out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
for name in ("chelsea", "coffee", "astronaut", "rocket"):
    Image.fromarray(getattr(d, name)()).save(out / f"{name}.png")
PYEOF
$VITKIT analyze "$CKPT" "$TMP"/photos/*.png --img-size 112 --out "$TMP/photos-out"
cp "$TMP/photos-out/rollout.png" "$HERE/photos_rollout.png"

# few-shot linear evaluation against raw pixels, plus the linear probe on all 60,000 training images
$VITKIT fewshot "$CKPT" --pixels --linear-probe --seeds 5 --out "$TMP/fewshot" --quiet | tee "$TMP/fewshot.txt"
cp "$TMP/fewshot/fewshot.png" "$HERE/fewshot.png"
cp "$TMP/fewshot/fewshot.json" "$HERE/fewshot.json"
echo "figures written to $HERE"
