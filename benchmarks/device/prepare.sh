#!/usr/bin/env bash
# Prepares, on a machine that reaches PyPI, what gpu_check.sh needs beyond a GPU machine's own
# packages, in two git-ignored folders to carry to it beside the working tree:
#   bash benchmarks/device/prepare.sh [OMNIGLOT_DIR]
#   .whl/                the wheels of the five packages such machines often lack (7 MB;
#                        WHEELS=0 skips them)
#   .gpu_data/omniglot/  images_background.zip and images_evaluation.zip (15 MB), copied from
#                        OMNIGLOT_DIR, a folder holding the official zips (the omniglot part)
# both in the repository's root (or in PREPARE_DIR).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [ $# -ge 1 ]; then
  for f in images_background.zip images_evaluation.zip; do
    if [ ! -f "$1/$f" ]; then
      echo "prepare.sh: $1/$f does not exist; OMNIGLOT_DIR must hold the official Omniglot" \
        "zips (images_background.zip, images_evaluation.zip)" >&2
      exit 2
    fi
  done
fi
src=${1:+$(cd "$1" && pwd)}
cd "${PREPARE_DIR:-$root}"
if [ "${WHEELS:-1}" != 0 ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    -d .whl ml_collections==1.1.0 tensorboardX==2.6.5 grain==0.2.18 array-record==0.8.6 \
    portpicker==1.6.0
fi
if [ -n "$src" ]; then
  mkdir -p .gpu_data/omniglot
  cp "$src/images_background.zip" "$src/images_evaluation.zip" .gpu_data/omniglot/
fi
du -sh .whl .gpu_data 2>/dev/null || true
