"""A bound on one fuzz case's time: a case that hangs fails instead of stalling the suite."""

import contextlib
import signal


@contextlib.contextmanager
def deadline(seconds: float):
  """Raises TimeoutError in a case that runs longer than `seconds` (main thread only)."""
  def expired(signum, frame):
    raise TimeoutError(f"a case ran past {seconds} s")
  previous = signal.signal(signal.SIGALRM, expired)
  signal.setitimer(signal.ITIMER_REAL, seconds)
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)
