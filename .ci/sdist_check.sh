#!/usr/bin/env bash
# The sdist as a user gets it: `python -m build --sdist`, its file list checked (sources in,
# generated C out), installed with build isolation into a fresh venv (pip fetches the build
# requirements from pyproject.toml, as on a user's machine), then imported outside the checkout
# and stepped. Leaves the tarball in WORK/dist for .ci/wheel_check.sh.
#     .ci/sdist_check.sh PYTHON WORK       PYTHON: an interpreter whose venv may get `build`
set -euo pipefail
py=$1 work=$2
repo=$(cd "$(dirname "$0")/.." && pwd)
log() { echo "  $*"; }
die() { echo "sdist check FAILED: $*" >&2; exit 1; }

"$py" -m pip install -q build > "$work/pip-build.log" 2>&1 || { tail -20 "$work/pip-build.log"; die "pip install build"; }
# a stale egg-info's SOURCES.txt is read back into the next sdist: start from none
rm -rf "$repo/fastpath.egg-info" "$work/dist"
if ! (cd "$repo" && "$py" -m build --sdist --outdir "$work/dist" .) > "$work/sdist.log" 2>&1; then
    tail -40 "$work/sdist.log"; die "python -m build --sdist"
fi
sdist=$(ls "$work"/dist/fastpath-*.tar.gz)
"$py" "$repo/.ci/pkg_check.py" sdist "$sdist" "$repo" || die "contents of $(basename "$sdist")"

python3 -m venv "$work/venv-sdist"
if ! "$work/venv-sdist/bin/pip" install -q "$sdist" > "$work/sdist-install.log" 2>&1; then
    tail -40 "$work/sdist-install.log"; die "pip install $(basename "$sdist") in a fresh venv"
fi
log "installed $(basename "$sdist") in a fresh venv (build isolation)"
(cd "$work" && "$work/venv-sdist/bin/python" "$repo/.ci/pkg_check.py" native "$work/sdist-steps.npz") \
    || die "import and step of the installed sdist"
(cd "$work" && "$work/venv-sdist/bin/fastpath" example-config > /dev/null) \
    || die "the fastpath command of the installed sdist"
