"""The benchmarks' official answer readers, re-stated from the public evaluation code's
behaviour as independent references for the tests (written here without looking at
jaxspatial's rules; each names the public file it follows). Not used by the library."""

import re

# --- MindCube: src/evaluation/core/extractors.py, extract_answer --------------------------
# Stages in priority order; each stage is (patterns, where), the first pattern with any match
# wins and gives its LAST match. Kept whole, including patterns an earlier stage shadows.
_MC_FIRST = [r"([A-E])\."]
_MC_SECTION = [r"[Mm]y answer is ([A-E])", r"[Mm]y answer is ([A-E])\.",
               r"[Tt]he answer is ([A-E])", r"(?:Answer: )?([A-E])\.", r"\b([A-E])\b"]
_MC_TEXT = [r"(?:Answer: )?([A-E])\. [A-Za-z0-9 \-\(\)\'\",]+(?=(?:\n|$|\.|\"))",
            r"(?:Answer: )?([A-E])\. [A-Za-z0-9 \-\(\)\'\"]+",
            r"(?:^|\n)(?:Answer: )?([A-E])(?:\.|$|\s)",
            r"[\*\"]([A-E])[\*\"]",
            r"\bAnswer:?\s*([A-E])\b",
            r"[Mm]y answer is ([A-E])",
            r"[Mm]y answer is ([A-E])\.",
            r"answer is ([A-E])"]


def _last_of_first(patterns, text):
  for pattern in patterns:
    found = re.findall(pattern, text)
    if found:
      return found[-1]
  return None


def mindcube_extract(text):
  if not text:
    return None
  letter = _last_of_first(_MC_FIRST, text)
  if letter:
    return letter
  section = re.search(r"<Answer>(.*?)(?:<|$)", text, re.DOTALL)
  if section:
    letter = _last_of_first(_MC_SECTION, section.group(1))
    if letter:
      return letter
  letter = _last_of_first(_MC_TEXT, text)
  if letter:
    return letter
  lines = text.split("\n")
  described = [m.group(1) for m in (re.search(r"([A-E])\. [A-Za-z0-9 \-\(\)\'\",]+", line)
                                    for line in lines) if m]
  if described:
    return described[-1]
  for line in lines[::-1]:
    m = re.search(r"\b([A-E])\b", line)
    if m:
      return m.group(1)
  return None


def mindcube_correct(reply, gt):
  letter = mindcube_extract(reply)
  return bool(letter) and letter == gt


# --- VSI-Bench: lmms_eval/tasks/vsibench/utils.py ------------------------------------------
def vsi_fuzzy(prediction):
  return prediction.split(" ")[0].rstrip(".").strip()


def vsi_multiple_choice(prediction, gt):
  return 1.0 if vsi_fuzzy(prediction).lower() == gt.lower() else 0.0


def vsi_numeric(prediction, gt):
  try:
    value = float(vsi_fuzzy(prediction))
  except ValueError:
    return 0.0
  thresholds = [0.5 + 0.05 * k for k in range(10)]
  relative = abs(value - float(gt)) / float(gt)
  return sum(relative <= 1 - t for t in thresholds) / len(thresholds)


# --- ChartQA: pix2struct/metrics.py, relaxed_correctness -----------------------------------
def chart_relaxed(target, prediction):
  def number(text):
    try:
      if text.endswith("%"):
        return float(text.rstrip("%")) / 100.0
      return float(text)
    except ValueError:
      return None
  p, t = number(prediction), number(target)
  if p is not None and t:
    return abs(p - t) / abs(t) <= 0.05
  return prediction.lower() == target.lower()


# --- BLINK: eval/test_benchmark.py, analyze_answer (its GPT-3.5 branch -> None) -------------
def blink_choice(answer, num_choices):
  choices = [f"({c})" for c in "ABCDE"[:num_choices]]
  words = set(answer.split())
  tail = set(answer.split("\n\n")[-1].split())
  every = [c for c in choices if c in words]
  last = [c for c in choices if c in tail]
  if answer in list("ABCDE"):
    return f"({answer})"
  if answer in [f"({c})" for c in "ABCDE"]:
    return answer
  if (len(every) != 1 and len(last) != 1) or not every:
    return None
  return last[0] if len(last) == 1 else every[0]


# --- Think3D: spagent/utils/utils.py, normalize_answer -------------------------------------
def spagent_normalize(answer):
  text = answer.strip()
  a, b = text.find("<answer>"), text.find("</answer>")
  if a != -1 and b != -1 and b > a:
    text = text[a + 8:b].strip()
  m = re.search(r"\(([A-D])\)|([A-D])\.", text)
  if m:
    return m.group(1) or m.group(2)
  for ch in text:
    if ch in "ABCD":
      return ch
  return text


# --- Realistic replies to a multiple-choice question ----------------------------------------
def chatty_replies(rng, answer, options="ABCD", option_texts=None):
  """Replies a chatty API model writes when it means `answer` (some contradict themselves
  or mention other options, as real replies do)."""
  option_texts = option_texts or {c: f"the {w} one" for c, w in zip(
      options, ("red", "blue", "green", "wooden", "tall"))}
  other = rng.choice([c for c in options if c != answer])
  forms = [
      f"{answer}", f" {answer}", f"{answer}.", f"({answer})", f"Answer: {answer}",
      f"The answer is {answer}.", f"The answer is {answer}", f"**{answer}**",
      f"**Answer: {answer}**", f"<answer>{answer}</answer>",
      f"<think>Option {other} looks plausible but the view says otherwise.</think>\n{answer}",
      f"<think>Let me compare {other} and {answer}.</think>\n<answer>{answer}</answer>",
      f"Looking at image 2, the object is {option_texts[answer]}.\n\nAnswer: {answer}",
      f"{answer}. {option_texts[answer]}",
      f"I think it's {option_texts[answer]}, so my answer is {answer}",
      f"Based on the views, {other}. {option_texts[other]} is wrong; the answer is {answer}.",
      f"\"{answer}\"", f"The correct option is {answer}: {option_texts[answer]}.",
      f"Final answer: ({answer})", f"{answer}\n\nExplanation: in image 1 it is on the left.",
      f"After careful analysis, option {answer} ({option_texts[answer]}) fits best.",
      f"Answer:{answer}", f"It must be {answer}",
      f"<Answer> The answer is {answer}",
      f"Among A, B, C and D, I pick {answer}.",
      # Forms MindCube's extractor reads as another letter, or as none.
      f"{other}. {option_texts[other]} is ruled out by image 3, so the answer is {answer}",
      f"I cannot decide between the options; it looks like {option_texts[answer]}.",
  ]
  return forms[rng.integers(len(forms))]
