#!/usr/bin/env bash
# Every translation verb on a GPU, end to end, with the shared Multi30k model (needs ../shared or
# HEADWISE_MODELS_DIR / HEADWISE_DATA_DIR). Prints BLEU in float32 (beam 4) and bfloat16 (greedy), then runs
# analyze, quantize, compress (cross-attention, calibrated) and prune (importance) on the device.
#     bash experiments/cuda_smoke.sh [cuda:0]
set -euo pipefail
H="python -m headwise.cli"
M="--model multi30k-marian-de-en --device ${1:-cuda}"
out=$(mktemp -d)
$H eval translation $M --split test_2016_flickr --src de --tgt en --beam 4 --json
$H eval translation $M --split test_2016_flickr --src de --tgt en --dtype bfloat16 --json
$H analyze --task translation $M --limit 200 --importance-examples 64 --out "$out/report"
$H quantize --task translation $M --limit 200 --methods linear_slog --bits 3..4 --out "$out/quantization"
$H compress --task translation $M --dk 64 --kinds dec-enc --calibration task --limit 200 --out "$out/collaborative"
$H prune --task translation $M --strategy importance --keep 48 --limit 200 --out "$out/pruned"
echo "all verbs ran on ${1:-cuda}; outputs in $out"
