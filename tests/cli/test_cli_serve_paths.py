"""`fastpath serve` (the CLI) answers as an Engine of the same model and config files."""


import fastpath
from fastpath import Engine
from helpers.paths import assert_same, make_model, make_stream, run_ticks, unique_name


def test_cli_serve_answers_as_an_engine_of_the_same_files(tmp_path):
    import subprocess
    import sys
    m = make_model("clf3_softmax")
    mp, cp = str(tmp_path / "m.fpm"), str(tmp_path / "c.toml")
    m.save(mp)
    with open(cp, "w") as f:
        f.write('[engine]\nn_symbols = 16\n[serve]\nplace = false\nidle = "yield"\n')
    raws, syms, ts, bad = make_stream(10)
    want = run_ticks(Engine(mp, config=cp).step, raws, syms, ts)
    name = unique_name()
    p = subprocess.Popen([sys.executable, "-m", "fastpath.cli", "serve", "--name", name,
                          "--model", mp, "--config", cp], cwd=str(tmp_path),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with fastpath.connect(name, timeout=60) as c:
            assert_same(run_ticks(c.step, raws, syms, ts), want, "fastpath serve")
    finally:
        p.terminate()
        out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert f"{int((~bad).sum())} served, 0 errors" in out
