"""Run the test suite (or part of it) on a loaded machine: N busy loops beside
pytest, as a shared CI box or a laptop in use would have.

    python scripts/loaded_suite.py 16                       # the whole suite, 16 busy loops
    python scripts/loaded_suite.py 16 tests/runtime/test_runtime.py # part of it

Prints the load average before and after and pytest's own output; exits with
pytest's code. SIGINT is set to its default in pytest (a background job of a
non-interactive shell inherits it ignored, which the Ctrl-C tests would see).
The busy loops are killed on every exit path. docs/performance.md, "Test
suite", has the results.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def main(argv: list[str]) -> int:
    if not argv or not argv[0].isdigit():
        print(__doc__, file=sys.stderr)
        return 2
    loops, args = int(argv[0]), argv[1:]
    _default_sigint()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_default_sigint)
            for _ in range(loops)]
    try:
        time.sleep(30)  # let the load average climb
        print(f"load average before: {os.getloadavg()}", flush=True)
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        start = time.monotonic()
        code = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=10",
                                *args], env=env, preexec_fn=_default_sigint)
        print(f"load average after: {os.getloadavg()}; wall {time.monotonic() - start:.0f} s; exit {code}",
              flush=True)
        return code
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
