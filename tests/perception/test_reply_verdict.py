"""The on-device judge reads its replies as the host judge does: `policy_judge.reply_reading`
on UTF-8 byte rows equals `judge.judge_verdict` on the decoded text (and the independent
reference of tests/perception/test_judge_verdicts.py) on the 200 generated replies, the
forms that test spells out, and the Unicode and byte forms only the device meets as bytes.
One compiled program reads every row."""

import random

import jax
import numpy as np
import pytest

from jaxspatial.perception.judge import decode_ids, judge_verdict
from jaxspatial.perception.policy_judge import reply_reading, reply_verdict
from tests.perception.test_judge_verdicts import _generated_reply, reference_verdict

# The forms tests/perception/test_judge_verdicts.py asserts, one per line of its tests.
FORMS = [
    "<think>Is it INCORRECT? The reference says sofa.</think>\nCORRECT",
    "It might be INCORRECT... no, the sofa matches.\n</think>\n\nCORRECT",
    "<THINK>incorrect?</Think> Correct", "<think>CORRECT?</think>\nINCORRECT",
    "<think>a <think>CORRECT</think> b</think>INCORRECT",
    "The prediction is not CORRECT.", "not correct", "It isn't correct.",
    "It isn\u2019t correct.", "The answer is not entirely correct.", "never correct",
    "This can't be considered correct", "**Not** *correct*", "NOT 'CORRECT'",
    "cannot be correct", "I wondered if it was not. Correct.", "not\nCORRECT",
    "not only correct", "not INCORRECT",
    "Correct.", "correct", "CORRECT", "cOrReCt!", "**CORRECT**", "Verdict: correct",
    "Incorrect.", "incorrect", "INCORRECT", "Verdict: **Incorrect**",
    "CORRECTLY", "The model INCORRECTLY named it", "correctness", "uncorrected", "CORRECT2",
    "correct's", "\u0130NCORRECT",
    "", "  \n ", "<think>The prediction is CORRECT, I think, but", "  <think>\nINCORRECT",
    "CORRECT\n<think>though maybe INCORRECT",
    "Maybe", "The prediction names the sofa.", "CORR", "C O R R E C T", "I cannot decide.",
    "<think>CORRECT</think>", "</think>",
    "INCORRECT\n... on reflection, CORRECT", "CORRECT\n... no wait, INCORRECT",
    "INCORRECT\non reflection, CORRECT\nThe sofa is the same one.",
    "CORRECT\nThe prediction names the sofa.", "CORRECT, not INCORRECT",
    "INCORRECT ... on reflection, CORRECT", "INCORRECT. It would be correct for the chair.",
    "CORRECT\r\n\r\n", "x\rCORRECT",
]

# Word and line boundaries by Python's Unicode classes, as the host regex draws them.
UNICODE_FORMS = {
    "\u201cCORRECT\u201d": True,            # curly quotes: no letters
    "CORRECT \u2713": True, "CORRECT\u2026": True, "CORRECT\u2014really": True,
    "\u00e9CORRECT": None, "CORRECT\u00e9": None,  # a two-byte letter joins the word
    "CORRECT\u00b2": None, "\u2167correct": None,  # a superscript digit, a Roman numeral
    "correct\u0661": None,                   # an Arabic-Indic digit
    "correct\U0001d400": None,               # a four-byte letter (MATHEMATICAL BOLD A)
    "\U0001f600correct": True,               # a four-byte symbol
    "CORRECT\u0301": True,                   # a combining mark is no letter
    "caf\u00e9 correct": True, "\u00e9'correct": None,  # an apostrophe between letters joins
    "not\u00a0correct": False, "not\u2003correct": False, "isn\u2019t correct": False,
    "\u00e9sn't correct": False,             # any letters before n't negate
    "INCORRECT ... on reflection, CORRECT\n\u2028\u00a0": False,  # rstrip() takes them
    "CORRECT, not INCORRECT\n\x85\u3000": False,
    "INCORRECT\u2028CORRECT": False,         # U+2028 is no line break for the rule
    "CORRECT\x0bINCORRECT\nok": False, "not\x0ccorrect": False,
    "\u0130ncorrect": None, "\u0131ncorrect": None, "\u212aorrect": None,  # ASCII folding
}

# Bytes that are no well-formed UTF-8 decode to U+FFFD, a symbol: never a letter or a line
# break, whatever an unchecked decoder would make of them.
BYTE_FORMS = {
    b"\xffCORRECT": True, b"CORRECT\x80": True, b"\xe2\x80CORRECT": True,
    b"\xe0\x81\x81CORRECT": True,                # overlong "A"
    b"INCORRECT\xe0\x80\x8aCORRECT": False,      # overlong "\n": one line
    b"\xc1\x81CORRECT": True,                     # overlong "A" in two bytes
    b"\xed\xa0\x80CORRECT": True,                 # a surrogate
    b"CORRECT\xf4\x90\x80\x80": True, b"\xf0\x9d\x90CORRECT": True,  # past U+10FFFF, cut
    b"\xc3\xa9CORRECT": None,                    # well formed: "\u00e9CORRECT"
}


# Every ASCII character, and non-ASCII ones of each kind, next to a verdict word: which
# join it, which a negation spans, which end a line.
NEIGHBOURS = [chr(c) for c in range(128)] + list(
    "\u00a0\u0085\u2028\u2029\u3000\u2019\u2018\u201c\u00b4\u2010\u2013\u00e9\u00df"
    "\u0130\u00b2\u0661\u0301\u00ad\u200b\ufeff\ufffd\U0001d400\U0001f600")
BOUNDARY_FORMS = [form.format(c) for c in NEIGHBOURS
                  for form in ("not{}correct", "not{}be correct", "{}correct", "correct{}x",
                               "INCORRECT{}CORRECT")]


def _rows(replies: list[bytes], width: int) -> np.ndarray:
  out = np.full((len(replies), width), -1, np.int32)
  for i, data in enumerate(replies):
    out[i, :len(data)] = list(data)
  return out


@pytest.fixture(scope="module")
def read():
  """The device reading of byte rows, as (True | False | None) per row: one program,
  vmapped over a leading axis of two halves on top of `reply_reading`'s own vmap."""
  program = jax.jit(jax.vmap(reply_reading))

  def run(rows: np.ndarray) -> list:
    half = len(rows) // 2
    assert 2 * half == len(rows)
    correct, unreadable = jax.device_get(program(rows.reshape(2, half, -1)))
    return [None if u else bool(c) for c, u in zip(correct.ravel(), unreadable.ravel())]
  return run


def test_the_tables_state_the_host_readings():
  for text, expected in UNICODE_FORMS.items():
    assert judge_verdict(text) is expected, text
  for data, expected in BYTE_FORMS.items():
    assert judge_verdict(data.decode("utf-8", "replace")) is expected, data


def test_the_device_reads_every_reply_as_the_host_judge(read):
  rng = random.Random(20240)  # the host test's seed: the same 200 replies
  generated = [_generated_reply(rng) for _ in range(200)]
  texts = generated + FORMS + list(UNICODE_FORMS) + BOUNDARY_FORMS
  data = [t.encode("utf-8") for t in texts]
  data += list(BYTE_FORMS) + [b"COR?RECT"]
  padded = len(data) % 2
  data += [b""] * padded
  rows = _rows(data, 4 + max(map(len, data)))
  rows[len(data) - 1 - padded, 3] = -1  # a -1 inside a row is dropped: "CORRECT"
  got = read(rows)
  host = [judge_verdict(decode_ids(row)) for row in rows]
  disagree = [(decode_ids(r), g, h) for r, g, h in zip(rows, got, host) if g is not h]
  assert not disagree, f"{len(disagree)} of {len(rows)} disagree; the first: {disagree[0]}"
  assert host[len(data) - 1 - padded] is True
  # And the test's independent reference, on the replies and forms it reads.
  count = len(generated) + len(FORMS)
  assert got[:count] == [reference_verdict(t) for t in generated + FORMS]
  outcomes = [got[:200].count(v) for v in (True, False, None)]
  assert min(outcomes) >= 25, outcomes


def test_reply_verdict_is_the_reading_with_unreadable_false():
  replies = [b"CORRECT", b"not correct", b"Maybe", b"", b"**Correct**", b"INCORRECT"]
  got = jax.jit(reply_verdict)(_rows(replies, 16))
  assert got.dtype == np.bool_ and got.tolist() == [True, False, False, False, True, False]
