"""Child processes that take Ctrl-C as they would at a terminal.

A shell that starts a job in the background without job control (`cmd &` in a script, as CI
wrappers and `nohup` runs do) starts it with SIGINT ignored, and every child inherits that: a
test that sends SIGINT to its child would then see nothing happen and fail for a reason that is
not the code's. Tests of what Ctrl-C does start the child with SIGINT's default restored."""

from __future__ import annotations

import signal


def sigint_default() -> None:
    """preexec_fn for subprocess.Popen: SIGINT's default action in the child, so Python installs
    its KeyboardInterrupt handler there whatever the test process inherited."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
