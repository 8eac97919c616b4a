"""PERIA's R_correct and R_format against a reference written here from the public reward
manager's rules (/work/shared/reference/peria.md section 9): the host rules agree on every
generated case, the device rules on every case inside their documented subset and never
give credit the reference withholds outside it."""

import random
import re

import jax
import numpy as np

from jaxspatial.rl.rewards import device_text, papers, text

PREDICTION_BYTES, REFERENCE_BYTES, FORMAT_BYTES = 128, 64, 256

# --- the reference, from the note ----------------------------------------------------------

SYNONYM_GROUPS = ({"yes", "yeah", "yep", "yup", "true", "correct"},
                  {"no", "nope", "nah", "false", "incorrect"},
                  {"n/a", "na", "none", "not available", "not applicable"})


def ref_prediction(response):
  """First <answer>(.*?)</answer> (any case, across lines) stripped; else what follows the
  first </think> (any case), stripped; else "". A prediction that is one \\boxed{...} is
  unwrapped."""
  found = re.search("<answer>(.*?)</answer>", response, re.IGNORECASE | re.DOTALL)
  if found:
    prediction = found.group(1).strip()
  else:
    pieces = re.split("</think>", response, maxsplit=1, flags=re.IGNORECASE)
    prediction = pieces[1].strip() if len(pieces) == 2 else ""
  if prediction.startswith("\\boxed{") and prediction.endswith("}"):
    prediction = prediction[len("\\boxed{"):-1].strip()
  return prediction


def ref_normalize(answer):
  """Each \\boxed{X} (X up to the first "}", no newline) replaced by X, scanning on after
  it; then strip, lower case, and every trailing "." dropped."""
  out, i = [], 0
  while i < len(answer):
    if answer.startswith("\\boxed{", i):
      close = answer.find("}", i + 7)
      newline = answer.find("\n", i + 7)
      if close >= 0 and not 0 <= newline < close:
        out.append(answer[i + 7:close])
        i = close + 1
        continue
    out.append(answer[i])
    i += 1
  normal = "".join(out).strip().lower()
  while normal.endswith("."):
    normal = normal[:-1]
  return normal


def ref_float(value):
  try:
    return float(value.strip().replace(",", ""))
  except ValueError:
    return None


def ref_range(value):
  found = re.match(r"^([\d.]+)%?\s*[-\u2013]\s*([\d.]+)%?$", value.strip())
  if not found:
    return None
  try:
    return float(found.group(1)), float(found.group(2))
  except ValueError:
    return None


def ref_pair(prediction, reference):
  p, g = ref_normalize(prediction), ref_normalize(reference)
  if p == g or any(p in group and g in group for group in SYNONYM_GROUPS):
    return 1.0
  if "," in g:
    g_items = {item.strip() for item in g.split(",")} - {""}
    p_items = {item.strip() for item in p.split(",")} - {""}
    if g_items and p_items and g_items == p_items:
      return 1.0
  a, b = ref_float(p), ref_float(g)
  if a is not None and b is not None and abs(a - b) < 1e-6:
    return 1.0
  a, b = ref_range(p), ref_range(g)
  return 1.0 if a is not None and b is not None and a == b else 0.0


def ref_correct(response, references):
  prediction = ref_prediction(response)
  return max(ref_pair(prediction, r) for r in references) if prediction else 0.0


def ref_gate(response, references):
  """The LLM judge is asked: rule 0, a prediction, not both single words (the ground truth
  as the public code prints it: a list of several is several words)."""
  prediction = ref_prediction(response)
  truth = references[0] if len(references) == 1 else str(list(references))
  short = len(prediction.split()) <= 1 and len(truth.split()) <= 1
  return ref_correct(response, references) == 0 and bool(prediction) and not short


def ref_format(response):
  flags = re.IGNORECASE | re.DOTALL
  think_ends = [m.end() for m in re.finditer("</think>", response, flags)]
  if not think_ends:
    return -1
  actions = [m.start() for m in re.finditer("<action>.*?</action>", response, flags)]
  if not re.search("<answer>.*?</answer>", response, flags):
    return 0 if actions else -1
  for start in actions:
    if all(end > start for end in think_ends):
      return -1
  return 1


# --- the device subset, from the device rule's documentation ------------------------------

PLAIN_DECIMAL = re.compile(r"[+-]?([0-9]*)\.?([0-9]*)")


def _significant(number):
  """(integer digits, fraction digits) without the zeros at the ends, or None when the text
  is not a plain ASCII decimal."""
  found = PLAIN_DECIMAL.fullmatch(number)
  if not found or not (found.group(1) or found.group(2)):
    return None
  return len(found.group(1).lstrip("0")), len(found.group(2).rstrip("0"))


def outside_device_subset(prediction, reference):
  """Why the device rule may differ from the public one on this pair ("" if it may not):
  non-ASCII case mapping, numbers that are not short plain decimals, range ends beyond 15
  significant digits, more than 16 comma pieces, or bytes beyond the device's widths."""
  if len(prediction.encode()) > PREDICTION_BYTES or len(reference.encode()) > REFERENCE_BYTES:
    return "length"
  p, g = ref_normalize(prediction), ref_normalize(reference)
  both = (prediction + reference)
  if any(not c.isascii() and c.lower() != c for c in both):
    return "case"
  if ref_float(p) is not None and ref_float(g) is not None:
    for side in (p, g):
      digits = _significant(side.replace(",", "").strip())
      if digits is None or digits[0] > 10 or digits[1] > 5:
        return "number"
  if ref_range(p) is not None and ref_range(g) is not None:
    for side in (p, g):
      ends = re.split(r"%?\s*[-\u2013]\s*", side.strip().rstrip("%"))
      if any(not e.isascii() or sum(_significant(e) or (99, 0)) > 15 for e in ends):
        return "range"
  if "," in g and max(p.count(","), g.count(",")) + 1 > device_text.PERIA_MAX_ITEMS:
    return "set"
  return ""


# --- generated cases -----------------------------------------------------------------------

NAMED_PAIRS = [("12.5", "125"), ("1.5", "15"), ("12.0", "12"), ("blue car", "red car"),
               ("Yes.", "yes"), ("yeah", "True"), ("N/A", "none"), ("a, b, c", "c,b,a"),
               ("1,000", "1000"), ("10-20%", "10%-20%"), ("10\u201320", "10-20"),
               ("\\boxed{42}", "42"), ("", "7"), ("   ", "7"), ("\\boxed{}", "x"),
               ("RED CAR.", "red car"), ("red car...", "Red car"), (" 7\n", "7"),
               ("7 .", "7"), ("x \\boxed{a} y", "x a y"), ("\\boxed{a}\\boxed{b}", "ab"),
               ("\\boxed{\\boxed{3}}", "3"), ("\\boxed{3\n}", "3"), ("-0.0", "0"),
               ("+.50", "0.5"), ("5.", "5"), (".", "."), ("1.2.3", "1.2.3"),
               ("10 - 20", "10\u201320"), ("10 %-20", "10-20"), ("a,,b,", "b, a"),
               ("a, b", "a, b, b"), ("123", "1,2,3"), ("Not Available", "n/a"),
               ("not  available", "n/a"), ("B", "b"), ("(B)", "B"), ("B.", "B"),
               ("\u00a012\u3000", "12"), ("12\u00a0000", "12000"),
               # outside the device subset: the public rule's float() and lower()
               ("1e3", "1000"), ("1_000", "1000"), ("\uff11\uff12", "12"),
               ("1.000001", "1"), ("0.0000001", "0"), ("\u00c9t\u00e9", "\u00e9t\u00e9"),
               ("12345678901234567", "12345678901234568"), ("inf", "infinity"),
               (",".join("abcdefghijklmnopqrst"), ",".join("tsrqponmlkjihgfedcba"))]

WORDS = ["red", "blue car", "left", "the sofa", "Chair", "door", "B", "c", "yes", "No",
         "none", "N/A", "true", "nope", "correct", "incorrect", "Not applicable"]


def _number_forms(rng, value):
  forms = [str(value), f"{value:.1f}", f"{value:.3f}", f"{value:,}", f"0{value}",
           f"+{value}", f" {value} ", f"{value}.", f"\\boxed{{{value}}}", f"{value}%"]
  return rng.choice(forms)


def _case(rng, word):
  return rng.choice([word, word.upper(), word.lower(), word.title()])


def generated_pairs(count, seed=0):
  rng = random.Random(seed)
  pairs = list(NAMED_PAIRS)
  while len(pairs) < count:
    kind = rng.randrange(6)
    if kind == 0:  # numbers, the same or a near miss
      value = rng.choice([0, 7, 12, 12.5, 125, 1.5, 15, 1000, 2024, 0.25, 3.14159, -3])
      other = rng.choice([value, value, value * 10, value + 1, -value])
      pairs.append((_number_forms(rng, value), _number_forms(rng, other)))
    elif kind == 1:  # ranges
      low, high = rng.choice([(10, 20), (0.5, 1.5), (5, 50)])
      dash = rng.choice(["-", "\u2013", " - ", " \u2013 "])
      form = lambda a, b: f"{a}{rng.choice(['', '%'])}{dash}{b}{rng.choice(['', '%'])}"
      other = rng.choice([(low, high), (float(low), high), (low, high + 1)])
      pairs.append((form(*other), form(low, high)))
    elif kind == 2:  # synonyms and near misses
      words = sorted(set().union(*SYNONYM_GROUPS)) + ["yess", "nope!", "n / a", "not"]
      pairs.append((_case(rng, rng.choice(words)) + rng.choice(["", ".", "..", " "]),
                    _case(rng, rng.choice(words))))
    elif kind == 3:  # comma sets
      items = rng.sample(["a", "b", "c", "red", "12", "the door"], rng.randint(2, 4))
      shuffled = rng.sample(items, len(items)) + rng.choice([[], [items[0]], [""]])
      if rng.random() < 0.3:
        shuffled = shuffled[:-1] or ["zz"]
      joiner = lambda xs: rng.choice([",", ", ", " ,"]).join(xs)
      pairs.append((joiner(shuffled), joiner(items)))
    elif kind == 4:  # phrases, case, dots, whitespace, wrappers
      word = rng.choice(WORDS)
      other = rng.choice([word, word, rng.choice(WORDS)])
      wrap = rng.choice(["{}", "{}.", " {} ", "\\boxed{{{}}}", "\t{}\n", "{}!", "x{}"])
      pairs.append((wrap.format(_case(rng, word)), _case(rng, other)))
    else:  # unrelated
      pairs.append((rng.choice(WORDS + ["12", "1,5", "10-20", ""]), rng.choice(WORDS)))
  return pairs


def _ids(texts, width):
  out = np.full((len(texts), width), -1, np.int32)
  for row, value in enumerate(texts):
    data = list(value.encode())[:width]
    out[row, :len(data)] = data
  return out


DEVICE_BATCH, DEVICE_REFERENCES = 512, 2


@jax.jit
@jax.vmap
def _compiled_correct(answer_L, references_RxLa):
  return device_text.peria_correct(answer_L, references_RxLa)


def _device_correct(predictions, references):
  """(rule, gate) per row on device, through one compiled shape (rows padded with
  repeats): `references` per row a list of at most DEVICE_REFERENCES strings."""
  rows = len(predictions)
  take = np.minimum(np.arange(DEVICE_BATCH), rows - 1)
  answers = _ids(predictions, PREDICTION_BYTES)[take]
  table = np.full((rows, DEVICE_REFERENCES, REFERENCE_BYTES), -1, np.int32)
  for row, refs in enumerate(references):
    table[row, :len(refs)] = _ids(refs, REFERENCE_BYTES)
  rule, gate = jax.device_get(_compiled_correct(answers, table[take]))
  return rule[:rows], gate[:rows]


def test_r_correct_host_and_device_agree_with_the_reference():
  pairs = generated_pairs(400)
  rng = random.Random(1)
  # A second reference on some rows ("" = none): the best counts, and a list of two is
  # never "short" for the judge's gate.
  seconds = [rng.choice(["", "", "", rng.choice(WORDS), p]) for p, _ in pairs]
  references = [[r] + ([s] if s else []) for (_, r), s in zip(pairs, seconds)]
  responses = [f"<think>t</think><answer>{p}</answer>" for p, _ in pairs]
  expected = [ref_correct(res, refs) for res, refs in zip(responses, references)]
  gates = [ref_gate(res, refs) for res, refs in zip(responses, references)]
  for res, refs, want, gate in zip(responses, references, expected, gates):
    prediction = text.peria_prediction(res)
    got = text.peria_correct(prediction, refs)
    assert got == want, (res, refs)
    assert text.peria_judge_gate(prediction, refs, got) == gate, (res, refs)
    assert papers.peria_correct_text(res, refs, judge=True) == float(want or gate)

  rule, gate = _device_correct([p for p, _ in pairs], references)
  outside = {}
  for k, ((p, r), refs) in enumerate(zip(pairs, references)):
    why = next((w for w in (outside_device_subset(p, x) for x in refs) if w), "")
    if why:
      outside[why] = outside.get(why, 0) + 1
      assert rule[k] <= expected[k], (p, refs)  # never credit the public rule withholds
      continue
    assert rule[k] == expected[k], (p, refs)
    assert gate[k] == gates[k], (p, refs)
  inside = len(pairs) - sum(outside.values())
  print(f"\nR_correct: {len(pairs)} pairs, host agrees on all; device agrees on {inside} "
        f"inside its subset; outside: {outside}; credited {int(sum(expected))}")
  assert len(pairs) >= 400 and inside >= 350 and 100 < sum(expected) < 300
  assert sum(outside.values()) >= 8


def test_worked_examples_of_the_issue():
  cases = {("12.5", "125"): 0, ("1.5", "15"): 0, ("12.0", "12"): 1, ("blue car", "red car"): 0,
           ("Yes.", "yes"): 1, ("yeah", "True"): 1, ("N/A", "none"): 1, ("a, b, c", "c,b,a"): 1,
           ("1,000", "1000"): 1, ("10-20%", "10%-20%"): 1, ("10\u201320", "10-20"): 1,
           ("\\boxed{42}", "42"): 1}
  rule, _ = _device_correct([p for p, _ in cases], [[r] for _, r in cases])
  for k, ((p, r), want) in enumerate(cases.items()):
    assert text.peria_correct(p, [r]) == want == int(rule[k]), (p, r)
  # The old SQuAD-style rule judge gave "12.5" full credit for "125" and "12.0" none for "12".
  assert text.peria_prediction("<THINK>a</THINK> \\boxed{ 7 } ") == "7"
  assert text.peria_prediction("<think>a</think><Answer> B </ANSWER>") == "B"
  assert text.peria_prediction("no tags") == ""


FORMAT_FRAGMENTS = ["<think>", "</think>", "</THINK>", "</Think>", "<action>", "</action>",
                    "<ACTION>", "</Action>", "<answer>", "</answer>", "<Answer>", "</ANSWER>",
                    "x", " ", "\n", '{"name": "image_crop"}', "</thi", "nk>", "<act", "ion>",
                    "\nuser\nTool executed successfully.\nObservation 1:\n\nassistant\n", "B"]


def _trajectory(rng):
  """A realistic episode: turns of think + action, then an answer or a cut-off, tags in
  random case, sometimes a missing or misplaced piece."""
  tag = lambda name: rng.choice([name, name.upper(), name.title()])
  turns = []
  for _ in range(rng.randint(0, 3)):
    think = f"<{tag('think')}>look</{tag('think')}>" if rng.random() > 0.1 else ""
    call = f'<{tag("action")}>{{"name": "image_crop"}}</{tag("action")}>'
    turns.append(rng.choice([think + call, think + call, call + think]))
    turns.append("\nuser\nTool executed successfully.\nObservation 1:\n\nassistant\n")
  ending = rng.choice([f"<think>ok</think><{tag('answer')}>B</{tag('answer')}>",
                       f"<think>ok</think><{tag('answer')}>B", "<think>ok", "",
                       f"<{tag('answer')}>B</{tag('answer')}>"])
  return "".join(turns) + ending


def test_r_format_host_and_device_agree_with_the_reference():
  rng = random.Random(2)
  texts = [_trajectory(rng) for _ in range(250)]
  texts += ["".join(rng.choice(FORMAT_FRAGMENTS) for _ in range(rng.randint(0, 12)))
            for _ in range(250)]
  texts += ["<think>a</think><action>1</action><action>2</action><answer>x</answer>",
            "<action>1</action><think>a</think><answer>x</answer>", "<think>a</think><answer>x",
            "<think>a</think><action>1", "<action>1</action></think><answer>x</answer>",
            "<think>a</think><answer><action>1</action></answer>"]
  texts = [t for t in texts if len(t.encode()) <= FORMAT_BYTES]
  # Python's IGNORECASE also folds these into tag letters: host only.
  folded = ["</thin\u212a><answer>x</answer>", "<think>a</think><\u017fnswer>x</answer>",
            "<think>a</think><act\u0131on>1</action><answer>x</answer>"]
  for t in texts + folded:
    assert text.peria_format(t) == ref_format(t), t
  device = jax.device_get(jax.jit(jax.vmap(device_text.peria_format))(
      _ids(texts + folded, FORMAT_BYTES)))
  np.testing.assert_array_equal(device[:len(texts)], [ref_format(t) for t in texts])
  counts = {v: sum(ref_format(t) == v for t in texts) for v in (-1, 0, 1)}
  print(f"\nR_format: {len(texts)} trajectories, host and device agree on all; "
        f"{len(folded)} with non-ASCII case folds: host only; by value {counts}")
  assert min(counts.values()) >= 40
  assert [ref_format(t) for t in folded] == [1, -1, 1]
