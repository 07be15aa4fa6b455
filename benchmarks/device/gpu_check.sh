#!/usr/bin/env bash
# Checks on a GPU machine, part by part: bash benchmarks/device/gpu_check.sh PART [PART ...]
#   versions    JAX / Flax / PyTorch versions, the device, what the models' convolutions lower to
#   tests       the numerics test files at the platform's default precision (objectives, mining,
#               losses, evaluation, precision, kernels, memory; max-pooling by slices against
#               reduce_window) -> tests.json (+ tests.log)
#   cross       every objective's loss and gradient and the exact kNN / retrieval metrics on the
#               GPU against the CPU of the same process (benchmarks/device/cross_platform.py)
#   main        the main job: train.py digits_evenodd_eps, then eval.py on its workdir -> main.log
#   throughput  ResNet-50 224 px training images/s: dml_jax real / cached / synthetic input in
#               bfloat16, synthetic in float32, and the PyTorch peer (eager and torch.compile)
#               in the same call -> throughput.json
#   omniglot    EPS Table 3 at the paper's scale (configs/omniglot_resnet50.py): Trip. + SH and
#               EPS + Trip. + SH, SEEDS seeds each (default 2), all runs at once on the GPU
#               -> omniglot.json, omniglot.md, omniglot.log
#   retrieval   SOP-scale exact retrieval (N = 60,000, D = 512), clustered and unstructured
#               embeddings -> retrieval.json (a report docs/tables.py renders)
#   clustering  k-means of the Omniglot protocols and at SOP scale (60,502 x 512, 11,316
#               clusters) -> clustering.json (a report docs/tables.py renders)
#   workers     bf16 real input with grain worker processes (WORKERS="8:2 15:1")
#   profile     where the bf16 ResNet-50 step's time goes: 3 synthetic steps under jax.profiler
#               -> step_profile.json / .txt (benchmarks/profiling/op_profile.py: ops and kinds
#               by device time, and the device's copy bandwidth and bf16 matmul rate measured
#               in the same call, the ceilings its GB/s are read against) and profile.tar.gz
#               (the trace and step.hlo.txt, the compiled step, for op_profile.py --trace_dir)
#   step        bf16 synthetic images/s of the step alone, once per line of STEP_VARIANTS
#               (extra train_throughput.py arguments, e.g. "--set=model.conv_impl=lax_aligned",
#               and XLA_FLAGS=--flag words, added to the environment's XLA_FLAGS; an empty
#               line: the step as it is; unset: as it is, conv_impl=lax, conv_impl=lax_aligned,
#               and with the convolutions in XLA's CUDA graphs, XLA_FLAGS=
#               --xla_gpu_enable_command_buffer=+CONVOLUTION), each in a fresh process (the
#               bf16 step compiled in 29 s on an H200: keep to about six variants per call)
#               -> step.json
# Timeouts bound each part (on one H100 / H200 with 16 CPU cores): 7.5 minutes for tests, cross
# and omniglot, 9 for throughput, 150 s a variant for step (the four default variants: 10
# minutes) and a WORKERS entry for workers; main and profile's analysis have none. Needs on the machine:
# Python 3.12 with JAX (CUDA), Flax, optax, orbax, chex, absl, numpy, scikit-learn, pillow,
# matplotlib, tqdm, pytest, pytest-xdist, PyTorch + torchvision (the peer); the wheels of the
# five packages such machines often lack go in .whl/ and are installed first (7 MB).
# Data: the official Omniglot zips (15 MB) in OMNIGLOT_ROOT (default .gpu_data/omniglot).
# benchmarks/device/prepare.sh OMNIGLOT_DIR fills both folders (git-ignored; carry them).
# Results go to $OUT (default runs/gpu_check); benchmarks/device/gpu_table.py makes the docs'
# table of them.
set -u
OUT=${OUT:-runs/gpu_check}; mkdir -p "$OUT"
OMNIGLOT_ROOT=${OMNIGLOT_ROOT:-.gpu_data/omniglot}
SEEDS=${SEEDS:-2}
if ! python3 -c "import ml_collections, grain, tensorboardX" 2>/dev/null && ls .whl/*.whl \
    >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
TP=${TP:-"python3 benchmarks/speed/train_throughput.py --batch_size=256 --group_size=8
    --num_classes=80 --per_class=16"}   # the step's command (the parts add their flags)
stamp() { python3 - "$@" <<'PY'
import json, sys, datetime, jax
path, part, commit = sys.argv[1:4]
d = json.load(open(path))
d = d if isinstance(d, dict) else {"rows": d}
d["stamp"] = {"part": part, "commit": commit, "date": datetime.date.today().isoformat(),
              "device": jax.devices()[0].device_kind, "jax": jax.__version__}
json.dump(d, open(path, "w"), indent=1)
PY
}
for part in "$@"; do case $part in
versions)
  nvidia-smi -L; nproc
  python3 - <<'PY' 2>&1 | tee "$OUT/versions.txt"
import jax, flax, optax, jax.numpy as jnp
print("jax", jax.__version__, "flax", flax.__version__, "optax", optax.__version__, jax.devices())
try:
  import torch, torchvision
  print("torch", torch.__version__, "torchvision", torchvision.__version__)
except ImportError:
  print("torch: not installed")
from dml_jax.models import conv
x = jnp.ones((8, 32, 32, 16), jnp.bfloat16); w = jnp.ones((3, 3, 16, 32), jnp.bfloat16)
f = jax.jit(lambda x, w: conv.conv_auto(x, w, (1, 1), "SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC")))
hlo = f.lower(x, w).compile().as_text()
print("conv_auto on", jax.default_backend(), "-> convolution ops:", hlo.count("convolution("),
      "custom-calls:", hlo.count("custom-call("), "dots:", hlo.count(" dot("))
PY
  ;;
tests)
  t0=$(date +%s)
  timeout -s INT -k 30 ${TESTS_TIMEOUT:-420} python3 -m pytest -q -n ${TEST_WORKERS:-8} -p no:cacheprovider \
    --junitxml="$OUT/tests.xml" tests/objectives tests/mining tests/test_losses.py \
    tests/evaluation tests/test_precision.py tests/kernels tests/test_memory.py \
    tests/models/test_conv.py::test_max_pool_equals_reduce_window_values_and_gradients_with_ties \
    > "$OUT/tests.log" 2>&1
  echo "pytest exit $? after $(( $(date +%s) - t0 )) s"; tail -25 "$OUT/tests.log"
  python3 - "$OUT/tests.xml" "$OUT/tests.json" $(( $(date +%s) - t0 )) <<'PY'
import json, sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suite = root if root.tag == "testsuite" else root[0]
cases = suite.findall("testcase")
failed = [f"{c.get('classname')}::{c.get('name')}" for c in cases
          if c.find("failure") is not None or c.find("error") is not None]
skipped = sum(c.find("skipped") is not None for c in cases)
json.dump({"tests": len(cases), "failed": len(failed), "skipped": skipped,
           "passed": len(cases) - len(failed) - skipped, "seconds": int(sys.argv[3]),
           "precision": "platform default (no JAX_DEFAULT_MATMUL_PRECISION)",
           "failures": failed}, open(sys.argv[2], "w"), indent=1)
PY
  rm -f "$OUT/tests.xml"; stamp "$OUT/tests.json" tests "$COMMIT" ;;
cross)
  timeout ${CROSS_TIMEOUT:-420} python3 benchmarks/device/cross_platform.py \
    --out="$OUT/cross_platform.json"
  stamp "$OUT/cross_platform.json" cross "$COMMIT" ;;
main)
  rm -rf /tmp/gpu_main
  { time python3 train.py --config=configs/digits_evenodd_eps.py --workdir=/tmp/gpu_main \
      --noprogress; time python3 eval.py --workdir=/tmp/gpu_main --noprogress; } \
    > "$OUT/main.log" 2>&1
  echo "main exit $?"; tail -30 "$OUT/main.log" ;;
throughput)
  timeout 240 $TP --dtypes=bfloat16 --inputs=real,cached,synthetic --num_workers=-1 --steps=30 \
    --warmup=3 --out="$OUT/tp_bf16.json" 2>&1 | tail -5
  timeout 100 $TP --dtypes=float32 --inputs=synthetic --steps=20 --warmup=2 \
    --out="$OUT/tp_f32.json" 2>&1 | tail -3
  timeout 200 python3 benchmarks/device/torch_peer.py --batch_size=256 --modes=eager,compiled \
    --out="$OUT/tp_torch.json" 2>&1 | tail -3
  python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]; rows = []
for name in ("tp_bf16.json", "tp_f32.json", "tp_torch.json"):
  path = os.path.join(out, name)
  if os.path.exists(path):
    d = json.load(open(path)); rows += d if isinstance(d, list) else d.get("rows", [d])
    os.remove(path)
json.dump({"rows": rows}, open(os.path.join(out, "throughput.json"), "w"), indent=1)
PY
  stamp "$OUT/throughput.json" throughput "$COMMIT" ;;
omniglot)
  W=/tmp/omniglot_resnet50; rm -rf "$W"; mkdir -p "$W"; t0=$(date +%s)
  for s in $(seq 0 $((SEEDS - 1))); do for pos in random easy; do
    timeout ${OMNI_TIMEOUT:-450} python3 -m dml_jax.run.experiments sweep \
      --config=configs/omniglot_resnet50.py --workdir="$W" --grid=loss.positive=$pos \
      --seeds=1 --seed_offset=$s --set=data.options.root="$OMNIGLOT_ROOT" ${OMNI_SET:-} \
      > "$W/log_${pos}_$s.txt" 2>&1 &
  done; done
  wait; t1=$(date +%s)
  tail -n 4 "$W"/log_*.txt > "$OUT/omniglot.log"
  python3 benchmarks/device/omniglot_summary.py --workdir="$W" --seconds=$((t1 - t0)) \
    --out="$OUT/omniglot.json" --md="$OUT/omniglot.md"
  stamp "$OUT/omniglot.json" omniglot "$COMMIT" ;;
retrieval)
  timeout 160 python3 benchmarks/speed/evaluation.py --sizes=60000 --methods=dml_jax \
    --out=/tmp/gpu_eval --summary="$OUT/retrieval.json" 2>&1 | tee "$OUT/evaluation.log" \
    | tail -6 ;;
clustering)
  timeout 200 python3 benchmarks/speed/clustering.py --sides=dml_jax \
    --out="$OUT/clustering.json" 2>&1 | tee "$OUT/clustering.log" | tail -10 ;;
profile)
  P=${PROFILE_DIR:-/tmp/gpu_profile}; rm -rf "$P"
  timeout 240 $TP --dtypes=bfloat16 --inputs=synthetic --steps=20 --warmup=3 \
    --trace="$P" --trace_steps=3 --out="$P/throughput.json" 2>&1 | tail -3
  python3 benchmarks/profiling/op_profile.py --trace_dir="$P/bfloat16" --calls=3 \
    --top=40 --out="$OUT/step_profile.json" > "$OUT/step_profile.txt" 2>&1
  echo "op_profile exit $?"; head -60 "$OUT/step_profile.txt"
  python3 - "$OUT/step_profile.json" <<'PY'   # the device's two ceilings, in the same call
import json, os, sys, time
import jax, jax.numpy as jnp
small = jax.default_backend() == "cpu"
def median_s(f, *args):
  jax.block_until_ready(f(*args)); times = []
  for _ in range(10):
    t = time.perf_counter(); jax.block_until_ready(f(*args)); times.append(time.perf_counter() - t)
  return sorted(times)[5]
v = jax.random.normal(jax.random.key(0), (2 ** (20 if small else 30),), jnp.bfloat16)
copy_s = median_s(jax.jit(lambda v: v + 1), v)   # reads and writes the array once
n = 512 if small else 8192
a, b = (jax.random.normal(jax.random.key(i), (n, n), jnp.bfloat16) for i in (1, 2))
matmul_s = median_s(jax.jit(lambda a, b: a @ b), a, b)
ceilings = {"copy_gb_per_s": 2 * v.nbytes / copy_s / 1e9,
            "bf16_matmul_tflop_per_s": 2 * n ** 3 / matmul_s / 1e12,
            "copy_bytes": 2 * v.nbytes, "matmul_n": n}
print(f"ceilings: copy {ceilings['copy_gb_per_s']:,.0f} GB/s (read + written), "
      f"bf16 {n}^3 matmul {ceilings['bf16_matmul_tflop_per_s']:,.1f} TFLOP/s")
if os.path.exists(sys.argv[1]):
  report = json.load(open(sys.argv[1])); report["ceilings"] = ceilings
  json.dump(report, open(sys.argv[1], "w"), indent=2)
PY
  rm -f "$P"/bfloat16/plugins/profile/*/*.trace.json.gz   # the Perfetto copy stays
  tar czf "$OUT/profile.tar.gz" -C "$P" . &&
    if [ "$(stat -c %s "$OUT/profile.tar.gz")" -gt 15000000 ]; then   # without the xplane
      tar czf "$OUT/profile.tar.gz" -C "$P" --exclude='*.xplane.pb' .
    fi
  ls -l "$OUT/profile.tar.gz" ;;
step)
  rm -f "$OUT"/step_[0-9]*.json
  i=0; variants=${STEP_VARIANTS-$'\n--set=model.conv_impl=lax\n--set=model.conv_impl=lax_aligned'\
$'\nXLA_FLAGS=--xla_gpu_enable_command_buffer=+CONVOLUTION'}
  while IFS= read -r variant; do
    i=$((i + 1)); flags=${XLA_FLAGS:-}; args=()
    for word in $variant; do   # XLA_FLAGS=--flag words add to the environment's XLA_FLAGS
      case $word in XLA_FLAGS=*) flags="$flags ${word#XLA_FLAGS=}" ;; *) args+=("$word") ;; esac
    done
    XLA_FLAGS=$flags timeout 150 $TP --dtypes=bfloat16 --inputs=synthetic --steps=30 \
      --warmup=3 "${args[@]}" --out="$OUT/step_$i.json" 2>&1 | tail -1
  done <<< "$variants"
  STEP_VARIANTS=$variants python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]; rows = []
for i, variant in enumerate(os.environ.get("STEP_VARIANTS", "").split("\n"), 1):
  path = os.path.join(out, f"step_{i}.json")
  if not os.path.exists(path):
    print(f"variant {i} ({variant.strip() or 'as is'}) failed: no result")
    continue
  rows += json.load(open(path))["results"]   # each row records its set and XLA_FLAGS
  os.remove(path)
json.dump({"rows": rows}, open(os.path.join(out, "step.json"), "w"), indent=1)
for row in rows:
  what = " ".join(row.get("set", []) + [row["xla_flags"]]).strip()
  print(f"{row['synthetic']:9.1f} images/s  {what or '(as is)'}")
PY
  stamp "$OUT/step.json" step "$COMMIT" ;;
workers)
  for wt in ${WORKERS:-8:2 15:1}; do
    timeout 150 $TP --dtypes=bfloat16 --num_workers=${wt%:*} --num_threads=${wt#*:} --steps=30 \
      --warmup=3 --inputs=real,input_only --out="$OUT/throughput_bf16_w${wt%:*}.json" \
      2>&1 | tail -2
  done ;;
*) echo "unknown part $part; allowed: versions tests cross main throughput omniglot retrieval" \
        "clustering workers profile step" >&2; exit 2 ;;
esac; done
