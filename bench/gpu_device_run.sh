#!/usr/bin/env bash
# gpu_device_run.sh: the GPU check on a GPU host in one command, from the files that
# bench/gpu_prepare.sh built here (.gpu-run/wheels, .gpu-run/sdist): nothing is fetched and,
# unless the prebuilt pycuda wheel does not import, nothing is compiled.
#
# Phases, each with its own time limit, its log in $OUT and a line in $OUT/device-run.json
# (rewritten after every phase, so a run cut short still says how far it got):
#   install    the wheels into $WORK/site (--no-index); pycuda from its sdist only if the
#              wheel does not import                                      200 s (the sdist)
#   smoke      one launch-path and one persistent inference against numpy  30 s
#   tests      the real-GPU tests of tests/gpu (the stand-in's run in CI)  120 s
#   gpu_check  bench/gpu_check.py: gpu-<device>.json                       240 s
# A phase past its limit gets SIGABRT: with PYTHONFAULTHANDLER=1 every thread's traceback is
# printed to its log first (where it was stuck). CUDA_MODULE_LOADING=EAGER throughout.
# About 3 minutes when all goes well, under 10 at worst: one 10-minute device command, e.g.
#   run(command="bash bench/gpu_device_run.sh", carry=[".gpu-run/wheels", ".gpu-run/sdist"],
#       timeout_s=600)
# then commit $OUT/gpu-<device>.json as bench/results/. `--dry-run` checks the carried files
# and prints the phases without running them.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="${GPU_RUN:-$ROOT/.gpu-run}"
OUT="${OUT:-$ROOT/gpu-out}"
PY="${PY:-python3}"
WORK="${WORK:-/tmp/fastpath-gpu}"
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
mkdir -p "$OUT" "$WORK"
JSON="$OUT/device-run.json"
export CUDA_MODULE_LOADING=EAGER PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
export PATH="/usr/local/cuda/bin:$PATH"
T0=$(date +%s)

# record NAME RC SECONDS NOTE: append one phase to $JSON (written whole each time)
record() {
    "$PY" - "$JSON" "$@" <<'PYEOF'
import json, os, sys, time
path, name, rc, secs, note = sys.argv[1:6]
try:
    with open(path) as f:
        r = json.load(f)
except (OSError, ValueError):
    r = {"schema": "fastpath-gpu-device-run/1", "phases": []}
r["phases"].append({"phase": name, "rc": int(rc), "seconds": int(secs), "note": note,
                    "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
r["ok"] = all(p["rc"] == 0 for p in r["phases"])
with open(path + ".tmp", "w") as f:
    json.dump(r, f, indent=1)
os.replace(path + ".tmp", path)
PYEOF
}

# phase NAME LIMIT CMD...: run CMD with a time limit, its output in $OUT/NAME.log
phase() {
    local name="$1" limit="$2" t rc
    shift 2
    echo "== $(date -u +%H:%M:%S) (+$(( $(date +%s) - T0 )) s) $name (limit ${limit} s)"
    if [ "$DRY" = 1 ]; then
        echo "   would run: $*"
        return 0
    fi
    t=$(date +%s)
    timeout -s ABRT -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    tail -20 "$OUT/$name.log"
    local note="ok"
    [ $rc -ne 0 ] && note="failed"
    case $rc in 124|134|137) note="stuck past ${limit} s: tracebacks in $name.log" ;; esac
    record "$name" "$rc" "$(( $(date +%s) - t ))" "$note"
    echo "   $name: rc=$rc ($note)"
    return $rc
}

ls "$CARRY"/wheels/pycuda-*.whl "$CARRY"/wheels/fastpath-*.whl >/dev/null 2>&1 \
    || { echo "gpu_device_run: no pycuda / fastpath wheel in $CARRY/wheels: run bench/gpu_prepare.sh here first" >&2; exit 2; }
echo "python $($PY -V 2>&1), wheels: $(cd "$CARRY/wheels" && ls | tr '\n' ' ')"
nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader 2>&1 || true

install() {
    rm -rf "$WORK/pycuda"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$WORK/site" "$CARRY"/wheels/*.whl || return 1
    if (cd "$WORK" && PYTHONPATH="$WORK/site" "$PY" -c "import pycuda.driver as c; c.init(); \
            print('pycuda', c.get_version(), 'driver', c.get_driver_version(), c.Device(0).name())"); then
        return 0
    fi
    echo "the pycuda wheel does not import here: building it from the sdist"
    bash "$ROOT/bench/gpu_pycuda_sdist.sh" "$CARRY"/sdist/pycuda-*.tar.gz "$WORK" || return 1
}
export -f install
export PY WORK CARRY ROOT
# the limit covers the sdist fallback's build; the wheels alone take seconds
phase install 200 bash -c install || exit 1
SITE="$WORK/site"
[ -d "$WORK/pycuda/pycuda" ] && SITE="$WORK/pycuda:$SITE"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"

# run from $WORK: the installed fastpath, not the checkout's sources, is imported
cd "$WORK" || exit 1
phase smoke 30 "$PY" "$ROOT/bench/gpu_check.py" --smoke --out "$OUT" --stuck-after 20
phase tests 120 "$PY" -m pytest -q -p no:cacheprovider -o faulthandler_timeout=60 \
    -k real_gpu "$ROOT/tests/gpu"
phase gpu_check 240 "$PY" "$ROOT/bench/gpu_check.py" --out "$OUT" --stuck-after 120
rc=$?
echo "== done in $(( $(date +%s) - T0 )) s (gpu_check rc=$rc)"
ls -la "$OUT"
exit $rc
