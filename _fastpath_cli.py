"""The `fastpath` command's entry point (pyproject's [project.scripts]): fastpath.cli.main,
with Ctrl-C during its start-up said as an interrupt (exit 130), not a traceback.

`import fastpath` loads numpy and the compiled engine (0.1-0.4 s); a Ctrl-C then raised
KeyboardInterrupt in the console script's own `from fastpath.cli import main`, before any
handler of the command ran: a traceback, and death by SIGINT. The handler has to be in place
before that import, and every fastpath.X import runs fastpath/__init__.py first: so this module
lives outside the package and imports nothing of it before its `try`. (`python -m fastpath.cli`
imports the package before any of its code runs, and keeps Python's default there.)

A Ctrl-C during the imports is held until they are done, then said as one: raised inside an
import, CPython can turn it into another error (a KeyboardInterrupt raised while a failed
`from X import Y` builds its message, as numpy's caught one does at every start, becomes
"TypeError: expected a message argument"), a traceback again.
"""
import sys


def main(argv=None) -> int:
    try:
        import signal
        held = []

        def hold(signum, frame):
            if held:                # a second Ctrl-C: the imports may be stuck
                raise KeyboardInterrupt
            held.append(signum)

        # only in place of Python's own handler: an ignored SIGINT stays ignored
        hold_it = signal.getsignal(signal.SIGINT) is signal.default_int_handler
        if hold_it:
            try:
                signal.signal(signal.SIGINT, hold)
            except ValueError:      # not the main thread
                hold_it = False
        try:
            from fastpath.cli import main as cli_main
        finally:
            if hold_it:
                signal.signal(signal.SIGINT, signal.default_int_handler)
        if held:
            raise KeyboardInterrupt
        return cli_main(argv)
    except KeyboardInterrupt:
        # raised outside the command's own handler (fastpath.cli._guarded, which says
        # `fastpath CMD: interrupted`): in the import or in argparse. A second Ctrl-C while
        # this exits would be a traceback from the exit itself: the stop is already under way
        import signal
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("fastpath: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
