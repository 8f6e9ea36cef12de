"""`radixserve serve` with a fault injected into every engine step, for tests/test_serve_shutdown.py:
`python faulty_serve.py raise|kill-thread serve [flags]`. "raise" makes each step fail with an error;
"kill-thread" ends the engine's loop thread (SystemExit raised inside it)."""
import sys

from radixserve.api.cli import main
from radixserve.runtime.model_runner import ModelRunner


def _raise(self, batch):
    raise RuntimeError("injected fault")


def _kill_thread(self, batch):
    raise SystemExit("injected: the loop thread ends")


ModelRunner.forward = {"raise": _raise, "kill-thread": _kill_thread}[sys.argv[1]]
sys.exit(main(sys.argv[2:]))
