#!/usr/bin/env bash
# One GPU check, for a machine with CUDA PyTorch but no network and no project virtualenv:
#   bash bench/gpu/check.sh [LOGDIR]
# Installs any wheels found in .whl/ (e.g. diffusers for the group-offload row) into a scratch
# site, then runs, each with its log in LOGDIR (default: gpu-logs/) and its own time limit in
# seconds (so one that hangs cannot take the others' time; set by the variables below):
#   curve        python -m bench.gpu --curve-only: the copy curve, each copy alone and 8 queued
#                back to back, saved as LOGDIR/h2d_curve.json and LOGDIR/h2d_curve_queued.json
#                for `python -m bench.plan_quality --copy-curve FILE` (first: it settles the
#                plan-quality suite's copy model)                               CURVE_S=60
#   cuda-tests   the CUDA tests (a test module that fails to import is reported,
#                the others still run; a test stuck 60 s dumps its stacks)      TESTS_S=180
#   bench-gpu    python -m bench.gpu --no-curve (latency, overlap, peak memory) BENCH_S=120
#   bench-kernels python -m bench.kernels (first Triton/inductor compiles)      KERNELS_S=150
# At most 510 s of steps with the defaults (plus 10 s per step to kill one that overruns), so a
# 590 s call limit leaves room for the set-up. Exit status 1 if the wheels did not install, the
# device probe failed, or any step failed or ran out of time. LOGDIR ends with 8 small files
# (device.log, 4 step logs, the 2 curves, kernels.json), easy to copy back whole from the GPU
# machine: give LOGDIR as an absolute path (e.g. $OUT); a relative one is under the repository.
# Wheels: `make gpu-wheels` downloads the one package the GPU machine lacks (diffusers, for the
# group-offload row and two test modules) into .whl/ (ignored by git: name it in the run's carry).
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=${1:-gpu-logs}
mkdir -p "$logs"
: >"$logs/device.log"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
status=0
if compgen -G ".whl/*.whl" >/dev/null; then
    if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/flextensor-site .whl/*.whl; then
        export PYTHONPATH="$PYTHONPATH:/tmp/flextensor-site"
    else
        echo "== wheels in .whl/ did not install (two versions of one package?)" | tee -a "$logs/device.log"
        status=1
    fi
fi
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))" 2>&1 | tee -a "$logs/device.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
run() {  # name, time limit (s), command...
    local name=$1 limit=$2; shift 2
    echo "== $name: $* (limit ${limit} s)"
    local start=$SECONDS rc
    if command -v timeout >/dev/null; then  # coreutils; without it the step runs unlimited
        timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$logs/$name.log"
    else
        "$@" 2>&1 | tee "$logs/$name.log"
    fi
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "== $name: ran out of its ${limit} s" | tee -a "$logs/$name.log"
    fi
    [ "$rc" -eq 0 ] || status=1
    echo "== $name: $((SECONDS - start)) s, exit $rc"
}
run curve "${CURVE_S:-60}" python3 -m bench.gpu --curve-only --curve-out "$logs/h2d_curve.json"
run cuda-tests "${TESTS_S:-180}" python3 -m pytest -q -p no:cacheprovider -m cuda \
    --continue-on-collection-errors -o faulthandler_timeout=60 tests
run bench-gpu "${BENCH_S:-120}" python3 -m bench.gpu --no-curve
run bench-kernels "${KERNELS_S:-150}" python3 -m bench.kernels --json "$logs/kernels.json"
exit $status
