"""`fastpath serve --tick-size`: the live books' tick sizes of a server started from the
command line, per symbol or one for all; bad values are usage errors before anything serves."""
import os
import signal

import pytest

import fastpath
from fastpath import InputError, lob
from fastpath._serve import segment_path
from helpers.book_serving import update
from helpers.serving import deadline, run_cli, serve_cli, uname


def test_tick_sizes_given_per_symbol_on_the_command_line(tmp_path):
    name = uname()
    p = serve_cli(tmp_path, name, args=("--tick-size", "0=0.01", "--tick-size", "2=0.5"))
    bs = lob.generate_stream(30, 1, seed=4)
    try:
        assert p.stdout.readline().startswith(f"serving '{name}'")
        with deadline(60), fastpath.connect(name, timeout=10) as c:
            for i in range(len(bs)):
                c.step_book(**update(bs, i))
            with pytest.raises(InputError, match=rf"symbol 1 has no tick size on server "
                                                 rf"'{name}'.*--tick-size 1=TICK"):
                c.step_book(**{**update(bs, 0), "symbol": 1})
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    assert p.returncode == 0, err
    assert f"stopped '{name}': {len(bs) + 1} served, 1 errors" in out


@pytest.mark.parametrize("args,msg", [
    (["--tick-size", "0"], "tick_sizes must be a finite number > 0"),
    (["--tick-size", "abc"], "--tick-size: 'abc' is not a number"),
    (["--tick-size", "0=0.01", "--tick-size", "x=1"], "give SYMBOL=TICK for each symbol"),
    (["--tick-size", "1000000000=0.01"], "tick_sizes: symbol 1000000000 must be an int in 0.."),
])
def test_bad_tick_size_option_is_a_usage_error(tmp_path, args, msg):
    name = uname()
    r = run_cli(["serve", "--name", name, *args], tmp_path)
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert msg in err and "Traceback" not in err
    assert not os.path.exists(segment_path(name))
