"""`fastpath doctor` from the command line: options out of range are usage errors naming the
option, a huge engine is sized without being built, a model that needs a head is sized with a
stand-in head.
"""

import json
import os
import re

import pytest

from fastpath.cli import main

from helpers.models import _onnx


@pytest.mark.parametrize("argv,option", [
    (["doctor", "--core", "-1"], "--core"),
    (["doctor", "--core", "70000"], "--core"),
    (["doctor", "--jitter", "nan"], "--jitter"),
    (["doctor", "--jitter", "0"], "--jitter"),
    (["doctor", "--jitter-threshold-ns", "0"], "--jitter-threshold-ns"),
])
def test_doctor_bad_option_is_a_usage_error_naming_it(argv, option, capsys):
    """--core -1 was reported as a config key the user never wrote, --jitter nan only after the
    host checks."""
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}:" in err, err


def test_doctor_core_not_online_names_the_option(capsys):
    online = sorted(os.sched_getaffinity(0))
    missing = next(c for c in range(1 << 16) if not os.path.exists(
        f"/sys/devices/system/cpu/cpu{c}"))
    assert main(["doctor", "--core", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"--core {missing} is not an online CPU" in err and "placement.core" not in err, err
    assert online      # the host has CPUs: the refusal is about the number, not the host


def test_doctor_sizes_a_huge_engine_on_a_host_without_room_for_it(monkeypatch, tmp_path, capsys):
    """doctor built the real engine to size it, faulting in gigabytes before it printed a check."""
    import json

    from fastpath import _memory as memory
    monkeypatch.setattr(memory, "available_bytes", lambda root="/": 64 << 20)
    p = tmp_path / "big.toml"
    p.write_text("[engine]\nn_symbols = 4194304\n")
    assert main(["doctor", "--json", "--config", str(p)]) in (0, 1)
    res = json.loads(capsys.readouterr().out)
    mlock = [c for c in res["checks"] if "4194304 symbols" in c["detail"]]
    assert mlock, [c["detail"] for c in res["checks"]]
    # serving it is refused with the reason, exit 2, not a traceback
    assert main(["serve", "--name", "h21cfg-big", "--config", str(p)]) == 2
    assert "lower engine.n_symbols" in capsys.readouterr().err


def _memlock_bytes(out: str) -> int:
    check = [c for c in json.loads(out)["checks"] if c["name"] == "rlimit_memlock"][0]
    return int(re.search(r"engine arena \+ state (\d+) B", check["detail"]).group(1))


def test_doctor_sizes_a_model_that_needs_a_head_without_one(tmp_path, capsys):
    from fastpath.cli import main
    p = _onnx(tmp_path, 3, "three.onnx")
    assert main(["doctor", "--model", str(p), "--json"]) in (0, 1)
    cap = capsys.readouterr()
    assert "stand-in head" in cap.err and "3 outputs and no head was given" in cap.err
    without = _memlock_bytes(cap.out)
    assert main(["doctor", "--model", str(p), "--json", "--head", "tanh_sigmoid:2,0"]) in (0, 1)
    cap = capsys.readouterr()
    assert "stand-in" not in cap.err
    assert _memlock_bytes(cap.out) == without          # the head is not memory


def test_doctor_still_refuses_a_model_no_head_loads(tmp_path, capsys):
    from fastpath.cli import main
    (tmp_path / "bad.fpm").write_bytes(b"not a bundle at all")
    assert main(["doctor", "--model", str(tmp_path / "bad.fpm")]) == 2
    err = capsys.readouterr().err
    assert "not a fastpath model bundle" in err and "stand-in" not in err
    # a head given on purpose is the user's: a bad one is refused, not replaced
    p = _onnx(tmp_path, 3, "three.onnx")
    assert main(["doctor", "--model", str(p), "--head", "classifier3"]) == 2
    assert "reads class probabilities" in capsys.readouterr().err
