"""The `fastpath` command's entry point (pyproject's [project.scripts]): fastpath.cli.main,
with Ctrl-C during its start-up said as an interrupt (exit 130), not a traceback.

`import fastpath` loads numpy and the compiled engine (0.1-0.4 s); a Ctrl-C then raised
KeyboardInterrupt in the console script's own `from fastpath.cli import main`, before any
handler of the command ran: a traceback, and death by SIGINT. The handler has to be in place
before that import, and every fastpath.X import runs fastpath/__init__.py first: so this module
lives outside the package and imports nothing of it before its `try`. (`python -m fastpath.cli`
imports the package before any of its code runs, and keeps Python's default there.)
"""
import sys


def main(argv=None) -> int:
    try:
        from fastpath.cli import main as cli_main
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
