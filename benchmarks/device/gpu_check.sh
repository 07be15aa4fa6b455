#!/usr/bin/env bash
# Checks for a lent GPU machine, in one call: bash benchmarks/device/gpu_check.sh [PART ...]
#   versions   JAX / Flax versions, and which convolution the models lower to there
#   bf16       ResNet-50 224 px training throughput, bfloat16, real / synthetic / input only
#   f32        the same step in float32, synthetic input
#   workers    bf16 real input with grain worker processes (data.num_workers) instead of threads
#              (WORKERS="8:2 15:1": workers:threads pairs)
#   retrieval  SOP-scale exact retrieval (N = 60,000, D = 512)
# (default: versions bf16 f32 retrieval). Logs and JSON go to $OUT (or runs/gpu_check). The
# machine's image lacks ml_collections, tensorboardX, grain, array-record and portpicker: put
# their wheels in .whl (README "Measured on a GPU" says how) and carry it.
set -u
OUT=${OUT:-runs/gpu_check}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
TP="python3 benchmarks/train_throughput.py --batch_size=256 --group_size=8 --num_classes=80
    --per_class=16 --dtypes=bfloat16"
for part in "${@:-versions bf16 f32 retrieval}"; do for p in $part; do case $p in
versions)
  nvidia-smi -L; nproc
  python3 - <<'PY' 2>&1 | tee "$OUT/versions.txt"
import jax, flax, optax, jax.numpy as jnp
print("jax", jax.__version__, "flax", flax.__version__, "optax", optax.__version__, jax.devices())
from dml_jax.models import conv
x = jnp.ones((8, 32, 32, 16), jnp.bfloat16); w = jnp.ones((3, 3, 16, 32), jnp.bfloat16)
f = jax.jit(lambda x, w: conv.conv_auto(x, w, (1, 1), "SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC")))
hlo = f.lower(x, w).compile().as_text()
print("conv_auto on", jax.default_backend(), "-> convolution ops:", hlo.count("convolution("),
      "custom-calls:", hlo.count("custom-call("), "dots:", hlo.count(" dot("))
PY
  ;;
bf16)
  timeout 200 $TP --num_workers=0 --num_threads=16 --steps=30 --warmup=3 --out="$OUT/throughput_bf16.json" \
    2>&1 | tee "$OUT/throughput_bf16.log" | tail -4 ;;
f32)
  timeout 120 $TP --dtypes=float32 --num_threads=16 --steps=20 --warmup=2 --inputs=synthetic \
    --out="$OUT/throughput_f32.json" 2>&1 | tee "$OUT/throughput_f32.log" | tail -4 ;;
workers)
  for wt in ${WORKERS:-8:2 15:1}; do
    timeout 150 $TP --num_workers=${wt%:*} --num_threads=${wt#*:} --steps=30 --warmup=3 \
      --inputs=real,input_only --out="$OUT/throughput_bf16_w${wt%:*}.json" \
      2>&1 | tee "$OUT/throughput_bf16_w${wt%:*}.log" | tail -2
  done ;;
retrieval)
  timeout 80 python3 benchmarks/evaluation.py --sizes=60000 --methods=dml_jax \
    --out="$OUT/eval" 2>&1 | tee "$OUT/evaluation.log" | tail -4 ;;
*) echo "unknown part $p; allowed: versions bf16 f32 workers retrieval" >&2; exit 2 ;;
esac; done; done
