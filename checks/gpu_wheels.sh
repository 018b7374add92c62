#!/usr/bin/env bash
# Fetch the wheels the GPU machine's image lacks (Python 3.12, x86-64 Linux) into .whl/ (ignored by git).
# Run it in the repository root of a machine that reaches PyPI; then checks/gpu_run.sh on the GPU machine with .whl
# taken along (CONTRIBUTING.md, "The GPU check").
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
    "pymetis==2025.2.2" "jsonargparse==4.53.0" "docstring-parser==0.18.0" "typeshed-client==2.15.0"
ls -l .whl
