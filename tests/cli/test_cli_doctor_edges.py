"""`fastpath doctor` edges: --gpu on a host without a GPU fails and says why; a config saved with
a UTF-8 byte-order mark still has its serve table seen."""

import os
import subprocess

import fastpath


# subprocesses run outside the checkout, so the installed package is imported, not the source
# folder (which has no built extensions when CI installs a wheel-like build)
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(fastpath.__file__)))


def test_doctor_gpu_with_no_gpu_fails_and_says_why(tmp_path):
    """Defect guarded: `fastpath doctor --gpu` on a host without a GPU passed gpu_numa and said
    nothing of the backend it was asked to check; gpu_numa fails and a gpu_backend check reports
    fastpath.gpu_status() with the fix."""
    import dataclasses
    import json
    import sys
    from fastpath.control import doctor
    from fastpath.control.placement import read_topology
    from helpers.host import make_host
    host = make_host(tmp_path)
    topo = dataclasses.replace(read_topology(host), gpus=[])
    by = {c["name"]: c for c in doctor.run_checks(host, topo=topo, use_gpu=True)["checks"]}
    assert by["gpu_numa"]["status"] == "fail" and "no GPU found" in by["gpu_numa"]["detail"]
    assert "gpu_backend" not in by
    by = {c["name"]: c for c in doctor.run_checks(host, topo=topo, use_gpu=False)["checks"]}
    assert by["gpu_numa"]["status"] == "pass"
    res = doctor.run_checks(host, use_gpu=True, gpu_backend=(False, "pycuda not importable"))
    by = {c["name"]: c for c in res["checks"]}
    assert by["gpu_backend"]["status"] == "fail" and "fastpath[gpu]" in by["gpu_backend"]["fix"]
    # the command line asks the running host (in a fresh process: tests in this one may have
    # put a pycuda stand-in in sys.modules)
    ok, why = json.loads(subprocess.run(
        [sys.executable, "-c", "import json, fastpath; print(json.dumps(fastpath.gpu_status()))"],
        capture_output=True, text=True, timeout=120, check=True, cwd=PKG_PARENT).stdout)
    out = subprocess.run([sys.executable, "-m", "fastpath.cli", "doctor", "--gpu", "--json"],
                         capture_output=True, text=True, timeout=120, cwd=PKG_PARENT)
    by = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    assert by["gpu_backend"]["status"] == ("pass" if ok else "fail")
    assert why in by["gpu_backend"]["detail"]


def test_doctor_sees_the_serve_table_of_a_config_with_a_byte_order_mark(tmp_path):
    """load_config reads a TOML file saved with a UTF-8 byte-order mark; doctor's "this host
    serves" check read it with tomllib directly, failed, and left the serve segment out of
    the mlock total."""
    from fastpath.control import doctor
    p = tmp_path / "c.toml"
    p.write_bytes(b"\xef\xbb\xbf[serve]\nslots = 64\n")
    assert doctor._serving_configured(str(p))
    assert doctor._serving_configured(p)
    assert not doctor._serving_configured(str(tmp_path / "missing.toml"))
