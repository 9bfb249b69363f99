#!/usr/bin/env bash
# One GPU check, for a machine with CUDA PyTorch but no network and no project virtualenv:
#   bash bench/gpu/check.sh [LOGDIR]
# Installs any wheels found in .whl/ (e.g. diffusers for the group-offload row) into a scratch
# site, then runs the CUDA tests, `python -m bench.gpu` (latency, overlap, peak memory, copy
# curve, each copy alone and 8 queued back to back, saved as LOGDIR/h2d_curve.json and
# LOGDIR/h2d_curve_queued.json for `python -m bench.plan_quality --copy-curve FILE`)
# and `python -m bench.kernels`, each with its log in LOGDIR (default: gpu-logs/).
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=${1:-gpu-logs}
mkdir -p "$logs"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/flextensor-site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/flextensor-site"
fi
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))" 2>&1 | tee "$logs/device.log"
status=0
run() {  # name, command...
    local name=$1; shift
    echo "== $name: $*"
    local start=$SECONDS
    "$@" 2>&1 | tee "$logs/$name.log" || status=1
    echo "== $name: $((SECONDS - start)) s"
}
run cuda-tests python3 -m pytest -q -p no:cacheprovider -m cuda tests
run bench-gpu python3 -m bench.gpu --curve-out "$logs/h2d_curve.json"
run bench-kernels python3 -m bench.kernels --json "$logs/kernels.json"
exit $status
