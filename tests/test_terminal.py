import signal
import subprocess
import sys

from terminal import sigint_default

PROBE = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"


def _child_takes_ctrl_c(**kw) -> bool:
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, **kw)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip() == "True"


def test_a_child_takes_ctrl_c_even_where_the_test_process_ignores_it():
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background job of a script starts
    try:
        assert not _child_takes_ctrl_c()  # the premise: the ignored SIGINT is inherited
        assert _child_takes_ctrl_c(preexec_fn=sigint_default)
    finally:
        signal.signal(signal.SIGINT, old)
