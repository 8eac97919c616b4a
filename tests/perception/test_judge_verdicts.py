"""How `LLMJudge` reads a judge's reply (`judge.judge_verdict`): the forms real models write
(reasoning blocks, negations, casing, reasoning returned apart), 200 generated replies
against a reference written here from the rule, hostile input, and the verdicts and the
unreadable count through the loopback chat server (tests/perception/chat_server.py)."""

import json
import random
import time

import numpy as np
import pytest

from jaxspatial.perception import judges
from jaxspatial.perception.judge import (NEGATION_FILLERS, NEGATORS, PROMPTS, ChatEndpoint,
                                         act3d_eval_judge, act3d_training_judge,
                                         judge_verdict, parse_reply)
from tests.deadline import deadline
from tests.perception.chat_server import ChatServer, normalise, read_case


@pytest.fixture(autouse=True)
def _bounded():
  with deadline(20):
    yield


# --- the forms, one test each ---------------------------------------------------------------

def test_a_think_block_with_a_decoy_verdict_then_correct_is_correct():
  assert judge_verdict("<think>Is it INCORRECT? The reference says sofa.</think>\nCORRECT")
  # Qwen3 thinking templates open the block in the prompt: only its end is in the reply.
  assert judge_verdict("It might be INCORRECT... no, the sofa matches.\n</think>\n\nCORRECT")
  assert judge_verdict("<THINK>incorrect?</Think> Correct") is True
  assert judge_verdict("<think>CORRECT?</think>\nINCORRECT") is False
  assert judge_verdict("<think>a <think>CORRECT</think> b</think>INCORRECT") is False


def test_a_negated_correct_is_incorrect():
  for reply in ["The prediction is not CORRECT.", "not correct", "It isn't correct.",
                "It isn\u2019t correct.", "The answer is not entirely correct.",
                "never correct", "This can't be considered correct", "**Not** *correct*",
                "NOT 'CORRECT'", "cannot be correct"]:
    assert judge_verdict(reply) is False, reply
  # A negation in another sentence, or on another line, negates nothing.
  assert judge_verdict("I wondered if it was not. Correct.") is True
  assert judge_verdict("not\nCORRECT") is True
  assert judge_verdict("not only correct") is True  # "only" is no negation filler
  assert judge_verdict("not INCORRECT") is False  # no double negation: INCORRECT stays


def test_the_verdict_words_read_in_any_case_and_as_whole_words():
  for reply in ["Correct.", "correct", "CORRECT", "cOrReCt!", "**CORRECT**", "Verdict: correct"]:
    assert judge_verdict(reply) is True, reply
  for reply in ["Incorrect.", "incorrect", "INCORRECT", "Verdict: **Incorrect**"]:
    assert judge_verdict(reply) is False, reply
  # Adverbs and nouns describe, they do not grade.
  for reply in ["CORRECTLY", "The model INCORRECTLY named it", "correctness", "uncorrected",
                "CORRECT2", "correct's"]:
    assert judge_verdict(reply) is None, reply
  assert judge_verdict("\u0130NCORRECT") is None  # not INCORRECT in ASCII: no verdict word


def test_empty_content_with_reasoning_is_unreadable():
  # The verdict is never read out of the reasoning a server returned apart.
  assert judge_verdict("", "The prediction names the same sofa, so CORRECT") is None
  assert judge_verdict(None, "CORRECT") is None
  assert judge_verdict("  \n ", "INCORRECT") is None
  assert judge_verdict("CORRECT", "Is it INCORRECT? No.") is True  # the content decides


def test_an_unterminated_think_block_is_all_reasoning():
  assert judge_verdict("<think>The prediction is CORRECT, I think, but") is None
  assert judge_verdict("  <think>\nINCORRECT") is None
  # Reasoning opened after an answer: the answer stands.
  assert judge_verdict("CORRECT\n<think>though maybe INCORRECT") is True


def test_a_reply_without_a_verdict_word_is_unreadable():
  for reply in ["", "Maybe", "The prediction names the sofa.", "CORR", "C O R R E C T",
                "I cannot decide.", "<think>CORRECT</think>", "</think>"]:
    assert judge_verdict(reply) is None, reply
  assert judge_verdict(b"CORRECT") is None and judge_verdict(7) is None  # not text


def test_the_final_line_reads_the_papers_rule_and_else_the_last_verdict_word():
  assert judge_verdict("INCORRECT\n... on reflection, CORRECT") is True
  assert judge_verdict("CORRECT\n... no wait, INCORRECT") is False
  assert judge_verdict("INCORRECT\non reflection, CORRECT\nThe sofa is the same one.") is True
  assert judge_verdict("CORRECT\nThe prediction names the sofa.") is True
  # One line holding both words: the paper's rule (CORRECT and not INCORRECT) says no.
  assert judge_verdict("CORRECT, not INCORRECT") is False
  assert judge_verdict("INCORRECT ... on reflection, CORRECT") is False
  assert judge_verdict("INCORRECT. It would be correct for the chair.") is False
  assert judge_verdict("CORRECT\r\n\r\n") is True and judge_verdict("x\rCORRECT") is True


# --- 200 generated replies against a reference ----------------------------------------------

_SOFT = set("*_\"'`\u2019-")
_FILLERS, _NEGATORS = set(NEGATION_FILLERS), set(NEGATORS)


def _ascii_lower(text: str) -> str:
  return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in text)


def _reference_answer(content: str) -> str:
  """The text after the last closing tag, up to an opening tag left open."""
  low = _ascii_lower(content)
  start, i = 0, low.find("</think>")
  while i >= 0:
    start = i + len("</think>")
    i = low.find("</think>", i + 1)
  rest = low[start:]
  cut = rest.find("<think>")
  return content[start:] if cut < 0 else content[start:start + cut]


def _tokens(line: str) -> list[tuple[str, str]]:
  """(kind, text) of a line, char by char: "word" (letters and digits, joined by single
  apostrophes between them), "soft" (one separator a negation may span), "hard"."""
  out, i = [], 0
  while i < len(line):
    c = line[i]
    if c.isalnum():
      j = i
      while j < len(line) and (line[j].isalnum() or (
          line[j] in "'\u2019" and j + 1 < len(line) and line[j + 1].isalnum()
          and line[j - 1].isalnum())):
        j += 1
      out.append(("word", line[i:j]))
      i = j
    else:
      out.append(("soft" if c in _SOFT or c.isspace() else "hard", c))
      i += 1
  return out


def _is_negator(word: str) -> bool:
  word = _ascii_lower(word).replace("\u2019", "'")
  if word in _NEGATORS:
    return True
  return word.endswith("n't") and word[:-3].isalnum() or word == "n't"


def _line_items(line: str) -> list[bool]:
  """Each verdict word of a line in order: True for an un-negated CORRECT."""
  tokens, items = _tokens(line), []
  for k, (kind, text) in enumerate(tokens):
    if kind != "word" or _ascii_lower(text) not in ("correct", "incorrect"):
      continue
    if _ascii_lower(text) == "incorrect":
      items.append(False)
      continue
    negated, fillers, j = False, 0, k - 1
    while True:  # walk back: soft separators, then a filler (at most two) or a negator
      gap = 0
      while j >= 0 and tokens[j][0] == "soft":
        gap, j = gap + 1, j - 1
      if gap == 0 or j < 0 or tokens[j][0] != "word":
        break
      if _is_negator(tokens[j][1]):
        negated = True
        break
      if _ascii_lower(tokens[j][1]) in _FILLERS and fillers < 2:
        fillers, j = fillers + 1, j - 1
        continue
      break
    items.append(not negated)
  return items


def reference_verdict(content: str):
  """Act3D's rule as the docstring states it, written independently of the judge."""
  lines, line = [], []
  for c in _reference_answer(content):
    if c in "\r\n":
      lines.append("".join(line))
      line = []
    else:
      line.append(c)
  lines.append("".join(line))
  filled = [ln for ln in lines if not ln.isspace() and ln]
  if not filled:
    return None
  final = _line_items(filled[-1])
  if final:
    return all(final)
  every = [item for ln in lines for item in _line_items(ln)]
  return every[-1] if every else None


_WORDS = ["CORRECT", "correct", "Correct", "cOrReCt"] * 2 + ["INCORRECT", "incorrect",
                                                            "Incorrect", "InCoRrEcT"]
_NEGATIONS = [""] * 6 + ["not ", "isn't ", "is not ", "not entirely ", "never ", "isn\u2019t ",
                         "can't be ", "not - ", "NOT **", "not at all ",
                         "cannot be considered "]


def _generated_reply(rng: random.Random) -> str:
  pick = rng.choice

  def word() -> str:
    return pick(_NEGATIONS) + pick(_WORDS)

  def decoy() -> str:
    return pick([f"Is it {word()}? The reference says the grey sofa.",
                 f"Maybe {word()}, maybe not.", "The prediction correctly names it.",
                 "Hmm, incorrectly phrased?", f"{word()}... wait.", "no verdict here"])

  def explanation() -> str:
    return pick(["The prediction names the same object.", "", "   ", "The colour differs.",
                 "Correctness depends on the colour.", "It was named INCORRECTLY by the tool.",
                 f"It would be {word()} for the chair.", "Stra\u00dfe, caf\u00e9, \u0130stanbul.",
                 f"so: {pick(_WORDS)}", f"on reflection, {word()}", "- the reference is 'sofa'"])

  def verdict_line() -> str:
    return (pick(["", "Verdict: ", "**Verdict:** ", "The prediction is ", "Answer: ",
                  "So it is ", "> "]) + word() + pick(["", ".", "!", "**", " \u2713", "."]))

  parts = [explanation() for _ in range(rng.randrange(3))]
  shape = rng.randrange(6)
  if shape == 0:
    parts.append(verdict_line())
  elif shape == 1:
    parts.insert(0, verdict_line())
  elif shape == 2:
    parts.append(f"{pick(_WORDS)} ... on reflection, {word()}")
  elif shape == 3:
    parts += [verdict_line(), explanation()]
  elif shape == 4:
    parts.append(f"{pick(_WORDS)}, not {pick(_WORDS)}")
  body = pick(["\n", "\n", "\r\n", " "]).join(parts)
  think = rng.randrange(7)
  inner = " ".join(decoy() for _ in range(rng.randrange(1, 4)))
  if think == 1:
    body = f"<think>{inner}</think>\n{body}"
  elif think == 2:
    body = f"{inner}\n</think>\n\n{body}"  # a Qwen3 template opened the block
  elif think == 3:
    body = f"<THINK>{inner}</Think>{body}"
  elif think == 4:
    body = f"<think>{inner}<think>{decoy()}</think>{decoy()}</think>\n{body}"
  elif think == 5:
    body = pick([f"<think>{inner}", f"{body}\n<think>{inner}"])  # never closed
  return body + pick(["", "", "\n", "\n\n  "])


def test_200_generated_replies_agree_with_the_reference():
  rng = random.Random(20240)
  replies = [_generated_reply(rng) for _ in range(200)]
  got = [judge_verdict(r) for r in replies]
  expected = [reference_verdict(r) for r in replies]
  disagree = [r for r, g, e in zip(replies, got, expected) if g is not e]
  assert not disagree, (f"{len(disagree)} of 200 disagree; the first: {disagree[0]!r}: judge "
                        f"{judge_verdict(disagree[0])}, reference "
                        f"{reference_verdict(disagree[0])}")
  # Every outcome is exercised, not only the easy one.
  assert min(expected.count(v) for v in (True, False, None)) >= 25, [
      expected.count(v) for v in (True, False, None)]


# --- hostile input ----------------------------------------------------------------------------

def test_hostile_replies_are_read_in_linear_time_without_raising():
  mb = 1 << 20
  cases = {
      "not " * (mb // 4) + "correct": False, " " * mb: None, "not" + " " * mb + "correct": False,
      "correct " * (mb // 8): True, "a" * mb + " correct": True, "isn't " * (mb // 6): None,
      "a'" * (mb // 2): None, "not" + " entirely" * (mb // 9) + " correct": True,
      "<think>" * (mb // 7) + "CORRECT": None, "</think>" * (mb // 8) + "CORRECT": True,
      "<think><think></think>" * (mb // 22) + "INCORRECT": False,
      "\u00e9\u0301\ud800" * (mb // 3) + "CORRECT": True, "-" * mb: None,
      "n" * mb + "n't correct": False, "not" + " *" * (mb // 2) + "correct": False,
      "\n" * mb + "correct\n" * 3: True, "\x00\uffff\U0001f600" * (mb // 3): None,
  }
  for reply, expected in cases.items():
    start = time.perf_counter()
    assert judge_verdict(reply) is expected, reply[:40]
    assert time.perf_counter() - start < 2.0, reply[:40]  # a quadratic path would not end


# --- the reply's reasoning ------------------------------------------------------------------

def test_parse_reply_hands_the_reasoning_through():
  def body(message):
    return json.dumps({"choices": [{"message": message, "finish_reason": "stop"}]}).encode()

  reply, _ = parse_reply(body({"content": None, "reasoning_content": "so CORRECT"}))
  assert reply == "" and reply.reasoning == "so CORRECT"
  reply, _ = parse_reply(body({"content": "CORRECT", "reasoning": "hmm"}))
  assert reply == "CORRECT" and reply.reasoning == "hmm"
  reply, _ = parse_reply(body({"content": [{"type": "text", "text": "COR"},
                                           {"type": "text", "text": "RECT"}]}))
  assert reply == "CORRECT" and reply.reasoning is None
  with pytest.raises(ValueError, match="no text content"):
    parse_reply(body({"content": None, "reasoning_content": ""}))
  with pytest.raises(ValueError, match="no text content"):
    parse_reply(body({"content": None, "reasoning": {"summary": "not text"}}))


def _endpoint(server) -> ChatEndpoint:
  return ChatEndpoint(server.base_url, "judge-model", api_key_env=None, timeout_s=5,
                      retries=0)


def test_reasoning_only_replies_are_unreadable_through_the_server():
  with ChatServer() as server:
    judge = act3d_training_judge(_endpoint(server))
    for field in ("reasoning_content", "reasoning"):
      server.reply_body = json.dumps({"choices": [{"finish_reason": "length", "message": {
          "role": "assistant", "content": None,
          field: "The sofa matches, so the verdict is CORRECT"}}]}).encode()
      got = judge.read_verdicts(["What is it?", "Which one?", "Where?"], ["sofa", "chair", ""],
                                [["sofa"], ["sofa"], ["by the door"]])
      assert got == [None, None, False]  # the empty prediction asks nothing
    assert judge.judge_texts(["What is it?"], ["sofa"], [["sofa"]]) == [False]
    stats = judge.stats()
    assert (stats["unreadable"], stats["correct"], stats["incorrect"], stats["requests"],
            stats["no_request"]) == (5, 0, 0, 5, 2)
    records = judge.records()
    assert len(records) == 5 and {r["verdict"] for r in records} == {"unreadable"}
    assert records[0]["reply"] == "" and "CORRECT" in records[0]["reasoning"]


def test_think_block_replies_through_the_server_and_the_byte_id_hook():
  def reply(body):
    case = read_case(body["messages"][-1]["content"])
    prediction = normalise(case["prediction"])
    if prediction == "unsure":
      return "<think>Is it CORRECT? The reference says"  # cut off mid-thought
    if any(prediction == normalise(r) for r in case["references"]):
      return "<think>Is it INCORRECT? The words differ.</think>\nCORRECT"
    return "<think>It could be CORRECT, but</think>\n\nThe prediction is not correct."

  with ChatServer() as server:
    server.reply_fn = reply
    judge = act3d_eval_judge(_endpoint(server))
    got = judge.read_verdicts(["What is it?", "Which colour?", "What?"],
                              ["The sofa", "red", "unsure"], [["sofa"], ["grey"], ["lamp"]])
    assert got == [True, False, None]
    ids = lambda texts, n: np.asarray([list(t.encode()) + [-1] * (n - len(t.encode()))  # noqa: E731
                                       for t in texts], np.int32)
    refs = ids(["sofa", "grey", "lamp"], 8)[:, None]
    hook = judge(ids(["What is it?", "Which colour?", "What?"], 16),
                 ids(["The sofa", "red", "unsure"], 10), refs)
    assert hook.dtype == np.bool_ and hook.tolist() == [True, False, False]
    stats = judge.stats()
    assert (stats["correct"], stats["incorrect"], stats["unreadable"]) == (2, 2, 2)
    assert [r["verdict"] for r in judge.records()[:3]] == ["correct", "incorrect", "unreadable"]


# --- Act3D's evaluation judge prompt ---------------------------------------------------------

def test_the_evaluation_judge_uses_the_shorter_prompt_that_accepts_fragments():
  evaluation, training = PROMPTS["act3d_eval"], PROMPTS["act3d"]
  assert len(evaluation.system) < len(training.system)
  assert "terse fragments count" in evaluation.system and '"sofa"' in evaluation.system
  assert "CORRECT or INCORRECT" in evaluation.system
  with ChatServer() as server:
    endpoint = _endpoint(server)
    assert act3d_eval_judge(endpoint).judge_texts(["Which object?"], ["sofa"],
                                                  [["sofa", "couch"]]) == [True]
    body = server.requests[-1]["body"]
    assert body["messages"][0]["content"] == evaluation.system
    assert (body["temperature"], body["max_tokens"]) == (0.0, 4)
    # The user message keeps the training prompt's layout (the server reads it).
    assert server.requests[-1]["case"]["references"] == ["sofa", "couch"]
    assert act3d_eval_judge(endpoint, "act3d").prompt is training  # the named option
    block = dict(url=server.base_url, model="judge-model", api_key_env=None)
    assert judges.make_judge(block, "act3d_eval").prompt is evaluation
    assert judges.make_judge(block, "act3d_eval", prompt="act3d").prompt is training
    assert judges.make_judge(block, "act3d_training").prompt is training
