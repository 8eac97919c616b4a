"""serving_bench's baseline, the static batcher, with a recording engine (no model): requests that share a new-token bucket
run as one batch, each with its own sampling settings, others wait their turn, a seeded request runs alone,
a failing batch fails only its requests and the worker goes on."""

import threading

import numpy as np
import pytest

from benchmarks.static_batcher import Batcher
from jaxspatial.serving.engine import Reply, Sampling, next_power
from jaxspatial.serving.prompt import Prompt


class _Engine:
  max_batch = 4

  def __init__(self):
    self.batches, self.programs, self.fail = [], set(), False
    self.gate = threading.Event()

  def shapes(self, prompts, max_new_tokens):
    return len(prompts), 64, next_power(max_new_tokens, 16)

  def generate(self, prompts, max_new_tokens, sampling, key):
    self.gate.wait(5)
    self.batches.append(([int(p.ids[0]) for p in prompts], max_new_tokens, sampling))
    if self.fail:
      raise RuntimeError("device fell over")
    return np.stack([p.ids for p in prompts]), len(prompts)

  def reply(self, row, prompt_tokens, max_tokens, stop=()):
    return Reply(str(int(row[0])), "length", max_tokens, prompt_tokens)


def _prompt(n):
  return Prompt(np.asarray([n, 0], np.int32), ())


def test_compatible_requests_batch_and_the_rest_wait():
  engine = _Engine()
  batcher = Batcher(engine, window_s=0.2)
  try:
    greedy, hot = Sampling(), Sampling(0.7, 0.9)
    with batcher._cond:  # pylint: disable=protected-access  (the worker waits for all nine)
      futures = [batcher.submit(_prompt(0), 8, greedy), batcher.submit(_prompt(1), 8, hot),
                 batcher.submit(_prompt(2), 10, greedy),
                 batcher.submit(_prompt(3), 8, greedy, seed=5),
                 batcher.submit(_prompt(4), 100, greedy)]
      futures += [batcher.submit(_prompt(5 + k), 16, greedy) for k in range(4)]
    engine.gate.set()
    assert [f.result(5).text for f in futures] == [str(k) for k in range(9)]
    rows = [b[0] for b in engine.batches]
    # 0, 1, 2 and 5..8 share the 16-token bucket (1 samples hot, in the same batch): 4 per
    # batch, oldest first; the seeded 3 runs alone.
    assert rows == [[0, 1, 2, 5], [3], [4], [6, 7, 8]]
    assert engine.batches[0][2] == [greedy, hot, greedy, greedy]
    assert batcher.stats()["batches"] == 4 and batcher.stats()["requests"] == 9
  finally:
    batcher.close()


def test_a_failing_batch_fails_its_requests_only():
  engine = _Engine()
  engine.gate.set()
  batcher = Batcher(engine, window_s=0.0)
  try:
    engine.fail = True
    with pytest.raises(RuntimeError, match="fell over"):
      batcher.submit(_prompt(1), 4, Sampling()).result(5)
    engine.fail = False
    assert batcher.submit(_prompt(2), 4, Sampling()).result(5).text == "2"
    assert batcher.stats()["failed_batches"] == 1
  finally:
    batcher.close()
  with pytest.raises(RuntimeError, match="stopped"):
    batcher.submit(_prompt(3), 4, Sampling())


def test_a_cancelled_request_is_dropped_unrun():
  engine = _Engine()
  batcher = Batcher(engine, window_s=0.0)
  try:
    with batcher._cond:  # pylint: disable=protected-access  (the worker takes nothing yet)
      first = batcher.submit(_prompt(1), 4, Sampling())
      second = batcher.submit(_prompt(2), 4, Sampling())
      assert second.cancel()  # its client hung up: it never runs
      third = batcher.submit(_prompt(4), 4, Sampling())
    engine.gate.set()
    assert first.result(5).text == "1" and third.result(5).text == "4"
    assert [b[0] for b in engine.batches] == [[1, 4]]
    stats = batcher.stats()
    assert stats["cancelled"] == 1 and stats["waiting"] == 0
  finally:
    batcher.close()
