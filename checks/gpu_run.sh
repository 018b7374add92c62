#!/usr/bin/env bash
# The GPU check on the GPU machine, as it is: what its image lacks from .whl/ (checks/gpu_wheels.sh), the project
# without its dependencies, then `python -m checks.gpu_check --scale`; its JSON and its printout go to $OUT (default
# checks/). Nothing is fetched. On a machine without CUDA it runs the check's CPU part and stops at "no CUDA device".
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-checks}"
SITE="${SITE:-/tmp/gnnpipe-site}"
mkdir -p "$OUT" "$SITE"
python3 -c "import torch, torch_geometric, lightning; print('torch', torch.__version__, '| torch_geometric',
torch_geometric.__version__, '| lightning', lightning.__version__, '| cuda', torch.cuda.is_available())"
for pair in pymetis:pymetis jsonargparse:jsonargparse docstring_parser:docstring_parser typeshed_client:typeshed_client; do
    module="${pair%%:*}"; wheel="${pair##*:}"
    if ! python3 -c "import $module" 2>/dev/null; then  # only what the image lacks
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
            .whl/"$wheel"-*.whl
    fi
done
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
python3 -m checks.gpu_check --scale --out "$OUT/gpu_check.json" 2>&1 | tee "$OUT/gpu_check.txt"
