"""The device run's scripts where no GPU is: their syntax, the dry runs, the phase record
device-run.json, and gpu_check --smoke's JSON on the stand-in driver."""

import json
import os
import subprocess
import sys

import pytest

from fastpath.gpu import gpu_status

from helpers.fake_cuda import FakeCuda, ROOT, _fake_pycuda, _gpu_check

SCRIPTS = ["gpu_prepare.sh", "gpu_device_run.sh", "gpu_pycuda_sdist.sh"]


def _bash(args, env=None, timeout=120):
    return subprocess.run(["bash", *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


@pytest.mark.parametrize("script", SCRIPTS)
def test_device_scripts_parse(script):
    r = _bash(["-n", os.path.join(ROOT, "bench", script)])
    assert r.returncode == 0, r.stderr


def test_prepare_dry_run_names_its_tools(tmp_path):
    r = _bash([os.path.join(ROOT, "bench", "gpu_prepare.sh"), "--dry-run"],
              env={"DEST": str(tmp_path / "g")})
    if r.returncode == 1 and "no Python 3.12 interpreter" in r.stderr:
        pytest.skip("no Python 3.12 here")
    if r.returncode == 1 and "nvcc not on PATH" in r.stderr:
        pytest.skip("no nvcc here")
    assert r.returncode == 0, r.stderr
    assert "python" in r.stdout and "dry run, nothing built" in r.stdout
    assert not (tmp_path / "g").exists()


def test_device_run_needs_the_prepared_wheels(tmp_path):
    r = _bash([os.path.join(ROOT, "bench", "gpu_device_run.sh"), "--dry-run"],
              env={"GPU_RUN": str(tmp_path / "none"), "OUT": str(tmp_path / "out")})
    assert r.returncode == 2 and "run bench/gpu_prepare.sh here first" in r.stderr


def _carried(tmp_path):
    w = tmp_path / "carry" / "wheels"
    w.mkdir(parents=True)
    for name in ("pycuda-2026.1-cp312-cp312-linux_x86_64.whl",
                 "fastpath-0.1.0-cp312-cp312-linux_x86_64.whl"):
        (w / name).write_bytes(b"not a wheel")
    return str(tmp_path / "carry")


def test_device_run_dry_run_lists_the_phases(tmp_path):
    env = {"GPU_RUN": _carried(tmp_path), "OUT": str(tmp_path / "out"), "PY": sys.executable,
           "WORK": str(tmp_path / "work")}
    r = _bash([os.path.join(ROOT, "bench", "gpu_device_run.sh"), "--dry-run"], env=env)
    assert r.returncode == 0, r.stderr
    phases = [ln.split(") ")[1].split(" (")[0] for ln in r.stdout.splitlines()
              if ln.startswith("== ") and "limit" in ln]
    assert phases == ["install", "smoke", "tests", "gpu_check"]
    assert "--smoke" in r.stdout and "--stuck-after" in r.stdout


def test_device_run_records_a_failed_phase_and_stops(tmp_path):
    """A failed install is written to device-run.json before the run stops."""
    env = {"GPU_RUN": _carried(tmp_path), "OUT": str(tmp_path / "out"), "PY": sys.executable,
           "WORK": str(tmp_path / "work")}
    r = _bash([os.path.join(ROOT, "bench", "gpu_device_run.sh")], env=env, timeout=300)
    assert r.returncode == 1
    rec = json.loads((tmp_path / "out" / "device-run.json").read_text())
    assert [p["phase"] for p in rec["phases"]] == ["install"]
    assert rec["phases"][0]["rc"] != 0 and rec["ok"] is False
    assert (tmp_path / "out" / "install.log").exists()


def test_smoke_writes_its_json_on_the_stand_in(tmp_path, monkeypatch, fake_fatbin):
    _fake_pycuda(monkeypatch, FakeCuda())
    try:
        assert _gpu_check().main(["--smoke", "--out", str(tmp_path)]) == 0
    finally:
        gpu_status.cache_clear()
    r = json.loads((tmp_path / "gpu-smoke.json").read_text())
    assert r["ok"] and r["device"] == "Fake GPU"
    for mode in ("launch", "persistent"):
        assert r[mode]["ok"] and r[mode]["max_abs_err"] <= 1e-5 and not r[mode]["refused"]


def test_smoke_says_which_path_failed(tmp_path, monkeypatch, fake_fatbin):
    _fake_pycuda(monkeypatch, FakeCuda(kernel_mode="never_starts"))
    gc = _gpu_check()
    monkeypatch.setattr(gc, "SMOKE_TIMEOUT_NS", 10**7)
    try:
        assert gc.main(["--smoke", "--out", str(tmp_path)]) == 1
    finally:
        gpu_status.cache_clear()
    r = json.loads((tmp_path / "gpu-smoke.json").read_text())
    assert r["launch"]["ok"] and not r["persistent"]["ok"] and not r["ok"]
    assert "did not start" in r["persistent"]["error"]


def test_psetup_builds_an_extension_from_several_sources(tmp_path):
    """gpu_psetup.py compiles every source of an extension (concurrently) and links them."""
    (tmp_path / "a.c").write_text("int fp_a(void) { return 40; }\n")
    (tmp_path / "b.c").write_text("int fp_b(void) { return 2; }\n")
    (tmp_path / "t.c").write_text(
        "#include <Python.h>\nint fp_a(void); int fp_b(void);\n"
        "static PyObject *answer(PyObject *s, PyObject *a) { return PyLong_FromLong(fp_a() + fp_b()); }\n"
        "static PyMethodDef ms[] = {{\"answer\", answer, METH_NOARGS, 0}, {0}};\n"
        "static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, \"t\", 0, -1, ms};\n"
        "PyMODINIT_FUNC PyInit_t(void) { return PyModule_Create(&m); }\n")
    (tmp_path / "setup.py").write_text(
        "from setuptools import setup, Extension\n"
        "setup(name='t', ext_modules=[Extension('t', ['t.c', 'a.c', 'b.c'])])\n")
    shim = os.path.join(ROOT, "bench", "gpu_psetup.py")
    r = subprocess.run([sys.executable, shim, "3", "build_ext", "--inplace"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-c", "import t; print(t.answer())"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "42", r.stderr
    r = subprocess.run([sys.executable, shim, "zero", "build_ext"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "JOBS a whole number" in r.stderr
