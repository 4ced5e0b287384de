#!/usr/bin/env bash
# What users run that the main test venv does not: the oldest numpy pyproject.toml allows
# (the manylinux wheel from .ci/wheel_check.sh, installed beside numpy at that floor), and
# the newer Pythons found on this machine (3.12, 3.13, on PATH or installed by pyenv: the sdist built with build
# isolation, as pip does for them). Each runs the core tests (kernels on every set, engine,
# state, bad input, the step call, non-finite refusals, window precision, reduced-precision
# weights, heads) from the checkout, importing the installed fastpath, never the checkout's.
#     .ci/compat_check.sh WORK       WORK holds dist/ (sdist) and wheelhouse/ (manylinux wheel)
set -euo pipefail
work=$1
repo=$(cd "$(dirname "$0")/.." && pwd)
log() { echo "  $*"; }
die() { echo "compat check FAILED: $*" >&2; exit 1; }
core=(tests/kernels/test_kernels_features.py tests/kernels/test_kernels_dense.py
      tests/kernels/test_kernels_cache.py tests/kernels/test_kernels_dispatch.py
      tests/engine/test_engine_step.py tests/cache/test_cache_guards.py
      tests/cache/test_cache_state_machine.py tests/engine/test_engine_threads.py
      tests/engine/test_engine_bad_input.py tests/model/test_model_bundle_bad_input.py
      tests/control/test_control_config_bad_input.py tests/gpu/test_gpu_backend_without_gpu.py
      tests/engine/test_engine_result.py tests/gpu/test_gpu_result_reuse.py
      tests/engine/test_engine_nonfinite.py tests/windows/test_windows_precision.py
      tests/weights/test_weights_lowp.py tests/bench/test_bench_weights_accuracy.py
      tests/heads/test_heads_outputs.py)

# pytest (the script, not `python -m pytest`, which would put the checkout first on sys.path)
# from the checkout: tests/ goes on sys.path, the package comes from the venv
run_core() {
    local venv=$1 what=$2
    if ! (cd "$repo" && "$venv/bin/pytest" -q -p no:cacheprovider "${core[@]}") \
            > "$work/core-$what.log" 2>&1; then
        tail -40 "$work/core-$what.log"; die "core tests with $what"
    fi
    log "$what: $(tail -1 "$work/core-$what.log")"
}

# the run-time floor from [project] dependencies (build-system's numpy>=2.0 is the build's)
floor=$(python3 -c 'import re, sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
print(next(m.group(1) for d in deps for m in [re.fullmatch(r"numpy>=(\d+\.\d+)(\.\d+)?", d)] if m))' \
    "$repo/pyproject.toml") || die "no numpy>= floor in pyproject.toml's dependencies"
fixed=$(ls "$work"/wheelhouse/fastpath-*manylinux*.whl) || die "no manylinux wheel in $work/wheelhouse"
python3 -m venv "$work/venv-floor"
"$work/venv-floor/bin/pip" install -q "numpy~=$floor.0" "pytest>=7" "hypothesis>=6.80" "$fixed" \
    > "$work/floor-install.log" 2>&1 || { tail -30 "$work/floor-install.log"; die "install numpy ~= $floor.0"; }
got=$("$work/venv-floor/bin/python" -c "import numpy; print(numpy.__version__)")
case $got in "$floor".*) ;; *) die "asked for numpy $floor.x, pip installed $got" ;; esac
run_core "$work/venv-floor" "numpy $got (the floor), Python $("$work/venv-floor/bin/python" -c "import sys; print(sys.version.split()[0])"), the manylinux wheel"

sdist=$(ls "$work"/dist/fastpath-*.tar.gz) || die "no sdist in $work/dist"
# an interpreter of that minor version: on PATH, or one pyenv installed (its shims answer only
# for the versions pyenv has selected)
find_py() {
    local name=python$1 c
    if "$name" -c "import venv" > /dev/null 2>&1; then command -v "$name"; return; fi
    if command -v pyenv > /dev/null; then
        for c in "$(pyenv root)"/versions/"$1".*/bin/"$name"; do
            if [ -x "$c" ] && "$c" -c "import venv" > /dev/null 2>&1; then echo "$c"; return; fi
        done
    fi
}
for minor in 3.12 3.13; do
    py=$(find_py "$minor")
    if [ -z "$py" ]; then
        log "python$minor: not on this machine, skipped"
        continue
    fi
    v="$work/venv-$minor"
    "$py" -m venv "$v"
    "$v/bin/pip" install -q "$sdist" "pytest>=7" "hypothesis>=6.80" > "$work/py$minor-install.log" 2>&1 \
        || { tail -40 "$work/py$minor-install.log"; die "pip install the sdist with $py"; }
    run_core "$v" "$($v/bin/python -c 'import sys, numpy; print(f"Python {sys.version.split()[0]}, numpy {numpy.__version__}")'), from the sdist"
done
