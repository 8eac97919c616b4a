"""An LLM judge that is a jaxspatial policy, run inside the compiled rollout.

`PolicyJudge` asks the same question as `judge.LLMJudge` (the same `JudgePrompt`: system
message, question, numbered reference answers, prediction, "CORRECT or INCORRECT"), but
the judge model is a jaxspatial policy on device: the prompt is assembled from the
rollout's byte ids, the policy samples its reply with `models.sampler`, and the verdict
is read from the reply's bytes by the host judge's rule (`reply_verdict` is
`judge.judge_verdict`: Act3D's CORRECT and not INCORRECT after the reasoning, whole words in
any case, a negated CORRECT incorrect, the final line first; no verdict word is False and
counted as unreadable). Nothing leaves the device, so a rollout judged this way has no host
round trip.

The prompt: the chat template rendered once with sentinels in place of the question, the
references and the prediction gives the static pieces between them (tokenised once); the
dynamic fields go in as single-byte tokens (every byte-level BPE vocabulary has one per
byte), normalised as `judge.one_line` (ASCII whitespace runs -> one space, trimmed),
padded and masked. Masked slots are neither attended nor counted in positions, so the
model reads exactly the token sequence whose text is the host judge's rendered prompt.
References are packed (empty ones dropped, as the host judge drops them) and numbered
from 1; a row with no reference or an empty prediction is False, as the host judge
returns without a request.

    judge = PolicyJudge.create(tokenizer, model, "act3d", temperature=0.0, max_tokens=4)
    verdicts = judge(question_ids, answer_ids, reference_ids)          # host call, jitted
    judge.stats()  # the host calls' verdicts: correct, incorrect, unreadable, no_request
    # inside the rollout: judge.verdicts(judge.state(), question, answer, references, key)

Not the same reply as a server's: the fields are spelled in byte tokens, not the
tokenizer's merges, so the text is the same but the token sequence is longer.
Non-ASCII whitespace (U+00A0, ...) is kept where `str.split` would split on it.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxspatial.models import sampler
from jaxspatial.perception.judge import NEGATION_FILLERS, NEGATORS, PROMPTS, JudgePrompt
from jaxspatial.rl.rewards import device_text
from jaxspatial.rollout import token_table as am
from jaxspatial.rollout.contract import DeviceJudge

Array = jax.Array
# ASCII whitespace as str.split() sees it (\x1c-\x1f included).
SPLIT_WHITESPACE = tuple(b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f")
_SENTINEL = "\u27e6{}\u27e7"  # mathematical brackets: never in a template
CHATML = ("<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
          "<|im_start|>assistant\n")


def render_chat(tokenizer, messages: list[dict]) -> str:
  """The tokenizer's chat template with a generation prompt, or Qwen's ChatML layout for a
  tokenizer without one (system + user)."""
  if getattr(tokenizer, "chat_template", None):
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  roles = [m["role"] for m in messages]
  if roles != ["system", "user"]:
    raise ValueError(f"render_chat: a tokenizer without a chat template renders a system "
                     f"and a user message, got roles {roles}")
  return CHATML.format(system=messages[0]["content"], user=messages[1]["content"])


def one_line_bytes(ids_L: Array) -> Array:
  """`judge.one_line` on -1-padded byte ids: whitespace runs between words become one
  space, leading and trailing whitespace go; -1 after."""
  real = ids_L >= 0
  space = jnp.zeros(ids_L.shape, bool)
  for byte in SPLIT_WHITESPACE:
    space |= ids_L == byte
  word = real & ~space
  before = jnp.cumsum(word) - word > 0                      # a word byte earlier
  after = jnp.flip(jnp.cumsum(jnp.flip(word))) - word > 0   # a word byte later
  run_start = space & ~jnp.concatenate([jnp.zeros(1, bool), space[:-1]])
  keep = word | (run_start & before & after)
  return device_text.compact(jnp.where(space, ord(" "), ids_L), keep)


def reply_bytes(tokens_BxN: Array, count_B: Array, token_bytes_VxK: Array,
                token_lengths_V: Array, stop_tokens: Sequence[int] = ()) -> Array:
  """[B, N * K] the reply's bytes (its first `count` tokens less stop tokens, special
  tokens spelled as nothing, as a server's `skip_special_tokens` reply), -1 after."""
  batch, length = tokens_BxN.shape
  width = token_bytes_VxK.shape[1]
  ids = jnp.clip(tokens_BxN, 0, token_bytes_VxK.shape[0] - 1)
  data = token_bytes_VxK[ids].astype(jnp.int32)                       # [B, N, K]
  shown = (jnp.arange(length)[None] < count_B[:, None]) & (tokens_BxN >= 0)
  for stop in stop_tokens:
    shown &= tokens_BxN != stop
  keep = (jnp.arange(width)[None, None] < token_lengths_V[ids][..., None]) & shown[..., None]
  flat = data.reshape(batch, length * width)
  return jax.vmap(device_text.compact)(flat, keep.reshape(batch, -1))


# --- the verdict on device: `judge.judge_verdict` on UTF-8 byte ids --------------------------

# The marks a negation may span besides spaces (`judge._SOFT`), and the apostrophes that
# join a word ("isn't") when they stand between two letters or digits.
NEGATION_MARKS = tuple(map(ord, "*_\"'`\u2019-"))
APOSTROPHES = (ord("'"), 0x2019)
# device_text's byte helpers, shared rather than copied.
_compact, _shifted = device_text.compact, device_text.shifted
_last, _in_class = device_text.last_true, device_text.in_class


def _utf8_characters(ids_L: Array) -> Array:
  """[L] the code points of -1-padded UTF-8 byte ids decoded as `judge.decode_ids` does
  (every -1 dropped, wherever it is), -1 after. A byte of no well-formed sequence (Unicode
  table 3-7: no overlong form, surrogate or code point past U+10FFFF) is a U+FFFD of its
  own; Python writes one per maximal ill-formed run, a count no rule here reads."""
  data = _compact(ids_L, ids_L >= 0)
  real = data >= 0
  byte = jnp.where(real, data, 0)
  after = lambda k: _shifted(byte, k, 0)  # byte[p + k], 0 past the end
  size = jnp.select([byte < 0x80, (byte >= 0xC2) & (byte <= 0xDF),
                     (byte >= 0xE0) & (byte <= 0xEF), (byte >= 0xF0) & (byte <= 0xF4)],
                    [1, 2, 3, 4], 0)
  low = jnp.select([byte == 0xE0, byte == 0xF0], [0xA0, 0x90], 0x80)    # the second byte's
  high = jnp.select([byte == 0xED, byte == 0xF4], [0x9F, 0x8F], 0xBF)   # range
  well_formed = real & (size > 0) & ((size < 2) | ((after(1) >= low) & (after(1) <= high)))
  for k in (2, 3):
    well_formed &= (size <= k) | ((after(k) >= 0x80) & (after(k) <= 0xBF))
  code = jnp.select([size == 2, size == 3, size == 4], [byte & 0x1F, byte & 0x0F, byte & 0x07],
                    byte)
  for k in (1, 2, 3):
    code = jnp.where(size > k, (code << 6) | (after(k) & 0x3F), code)
  covered = jnp.zeros(byte.shape, bool)
  for k in (1, 2, 3):
    covered |= _shifted(well_formed & (size > k), -k, False)
  code = jnp.where(well_formed, code, 0xFFFD).astype(jnp.int32)
  return _compact(code, real & ~covered)


def _read_reply(ids_L: Array) -> tuple[Array, Array]:
  """(correct, unreadable) of one reply: `judge.judge_verdict` read on its characters."""
  chars = _utf8_characters(ids_L.astype(jnp.int32))
  length = chars.shape[-1]
  index = jnp.arange(length)
  folded = jnp.where((chars >= ord("A")) & (chars <= ord("Z")), chars + 32, chars)

  def spelled(word: str) -> Array:  # [L] `word` (ASCII lower case) starts here, any case
    hit = jnp.ones(length, bool)
    for k, char in enumerate(word):
      hit &= _shifted(folded, k, -1) == ord(char)
    return hit

  # `judge.strip_reasoning`: after the last </think>, up to a <think> left open.
  closes = spelled("</think>")
  start = jnp.where(jnp.any(closes), _last(closes) + len("</think>"), 0)
  opens = spelled("<think>") & (index >= start)
  end = jnp.where(jnp.any(opens), jnp.argmax(opens), length)
  answer = (chars >= 0) & (index >= start) & (index < end)
  # Python's own classes (`[^\W_]`, `\s`), as the host regex reads them.
  alnum = answer & _in_class(chars, r"\w") & (chars != ord("_"))
  space = answer & _in_class(chars, r"\s")
  newline = answer & ((chars == ord("\n")) | (chars == ord("\r")))
  soft = answer & ((space & ~newline) | jnp.isin(chars, jnp.asarray(NEGATION_MARKS)))
  # Words: letters and digits, joined by an apostrophe between two of them ("isn't").
  joiner = jnp.isin(chars, jnp.asarray(APOSTROPHES)) & _shifted(alnum, -1, False) & _shifted(
      alnum, 1, False)
  in_word = alnum | joiner
  word_start = in_word & ~_shifted(in_word, -1, False)
  word_end = in_word & ~_shifted(in_word, 1, False)

  def whole(word: str) -> Array:  # [L] the word `word` starts here
    return word_start & spelled(word) & _shifted(word_end, len(word) - 1, False)

  def ends(word: str) -> Array:  # [L] the word `word` ends here
    return _shifted(whole(word), -(len(word) - 1), False)

  # A negator: "not", "never", "cannot", or letters and digits then n't (one apostrophe).
  last_mark = jax.lax.cummax(jnp.where(joiner | word_start, index, -1))
  one_apostrophe = word_start[jnp.maximum(last_mark, 0)] & (last_mark >= 0)
  negator_end = (word_end & (folded == ord("t")) & _shifted(joiner, -1, False)
                 & (_shifted(folded, -2, -1) == ord("n")) & _shifted(one_apostrophe, -2, False))
  for word in NEGATORS:
    negator_end |= ends(word)
  filler_end = jnp.zeros(length, bool)
  for word in NEGATION_FILLERS:
    filler_end |= ends(word)
  last_hard = jax.lax.cummax(jnp.where(soft, -1, index))  # the last non-soft char up to p
  owner_start = jax.lax.cummax(jnp.where(word_start, index, -1))

  def word_before(first_L: Array) -> tuple[Array, Array, Array]:
    """(a negator, a filler, its first char) per word starting at `first`: the word right
    before it across a run of soft chars (one at least)."""
    last = last_hard[jnp.maximum(first_L - 1, 0)]
    joined = (first_L >= 1) & (last >= 0) & (last < first_L - 1)
    at = jnp.maximum(last, 0)
    return joined & negator_end[at], joined & filler_end[at], owner_start[at]

  negator1, filler1, first1 = word_before(index)
  negator2, filler2, first2 = word_before(first1)
  negator3, _, _ = word_before(first2)
  negated = negator1 | (filler1 & (negator2 | (filler2 & negator3)))
  correct_word = whole("correct")
  verdict_word = correct_word | whole("incorrect")
  correct_L = correct_word & ~negated
  # The final line: the line of the answer's last non-whitespace char (`rstrip()`).
  last_solid = _last(answer & ~space)
  final_line = _last(newline & (index < last_solid)) + 1
  on_final_line = verdict_word & (index >= final_line)
  last_word = _last(verdict_word)
  readable = last_word >= 0
  correct = jnp.where(jnp.any(on_final_line), jnp.all(correct_L | ~on_final_line),
                      readable & correct_L[jnp.maximum(last_word, 0)])
  return correct, ~readable


def reply_reading(bytes_BxL: Array) -> tuple[Array, Array]:
  """(correct [B], unreadable [B]) of -1-padded UTF-8 replies, read as
  `judge.judge_verdict` reads the decoded text (True -> correct, None -> unreadable):
  Python's own Unicode letters, digits and whitespace decide word and line boundaries, so
  "\u201cCORRECT\u201d" is a verdict and "\u00e9CORRECT" or "CORRECT\u00b2" are not."""
  return jax.vmap(_read_reply)(jnp.asarray(bytes_BxL))


def reply_verdict(bytes_BxL: Array) -> Array:
  """bool [B]: `judge.judge_verdict` on each reply is True (an unreadable one is False, as
  the host judge hook returns it)."""
  return reply_reading(bytes_BxL)[0]


def judge_byte_tables(tokenizer, vocab_size: int) -> tuple[tuple[int, ...], np.ndarray,
                                                            np.ndarray]:
  """(the single-byte token of each of the 256 byte values, token bytes [V, K] int32,
  lengths [V]) of a byte-level BPE tokenizer; special tokens and ids past the tokenizer
  have length 0 (a served reply skips them)."""
  pieces, special = am.token_bytes(tokenizer)
  if vocab_size < len(pieces):
    raise ValueError(f"PolicyJudge: the model's vocabulary ({vocab_size}) is smaller than "
                     f"the tokenizer's ({len(pieces)})")
  singles = am.single_byte_tokens(pieces, special)
  missing = [b for b in range(256) if singles[b] < 0]
  if missing:
    raise ValueError(f"PolicyJudge: the tokenizer has no single-byte token for bytes "
                     f"{missing[:8]}{'...' if len(missing) > 8 else ''}: only byte-level BPE "
                     "tokenizers can spell any text")
  table, lengths = am.byte_table(pieces, vocab_size, keep=~np.asarray(special))
  return tuple(singles), table, lengths


@dataclasses.dataclass(eq=False)  # hashed by identity: a static argument of the rollout's jit
class PolicyJudge(DeviceJudge):
  """A jaxspatial policy as the rollout's judge, on device. `state()` is what the compiled
  rollout takes as an argument (the model and the token table); the rest is static."""

  on_device = True  # the rollout calls `verdicts` inside its program, not a host callback

  model: Any
  tokenizer: Any
  prompt: JudgePrompt
  sampling: sampler.SamplingConfig
  byte_tokens: tuple[int, ...]
  token_bytes: np.ndarray
  token_lengths: np.ndarray
  _pieces: dict = dataclasses.field(default_factory=dict, repr=False)
  _counts: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(
      ("rows", "requests", "correct", "incorrect", "unreadable", "no_request"), 0), repr=False)
  _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

  @classmethod
  def create(cls, tokenizer, model, prompt: str | JudgePrompt = "act3d",
             temperature: float = 0.0, max_tokens: int = 16, top_p: float = 1.0,
             stop_tokens: Sequence[int] | None = None,
             cache_dtype: str = "float32") -> "PolicyJudge":
    """`prompt`: a `judge.PROMPTS` name or a JudgePrompt; stop tokens default to the
    tokenizer's <|im_end|> and EOS."""
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    if isinstance(prompt, str):
      if prompt not in PROMPTS:
        raise ValueError(f"PolicyJudge: unknown prompt {prompt!r}; known: {sorted(PROMPTS)}")
      prompt = PROMPTS[prompt]
    if prompt.reading != "correct_incorrect":
      raise ValueError(f"PolicyJudge: prompt {prompt.name!r} is read as {prompt.reading!r}; "
                       "the on-device judge reads CORRECT / INCORRECT only (serve the judge "
                       "and pass its url instead)")
    if int(max_tokens) != max_tokens or max_tokens < 1:
      raise ValueError(f"PolicyJudge.max_tokens: expected an integer >= 1, got {max_tokens!r}")
    if temperature != 0 and not 1e-3 <= temperature:
      raise ValueError(f"PolicyJudge.temperature: expected 0 (greedy) or >= 1e-3, got "
                       f"{temperature!r}")
    if stop_tokens is None:
      ids = {tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id}
      stop_tokens = tuple(sorted(i for i in ids if i is not None and i != tokenizer.unk_token_id))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    singles, table, lengths = judge_byte_tables(tokenizer, model.config.text.vocab_size)
    return cls(model=model, tokenizer=tokenizer, prompt=prompt,
               sampling=sampler.SamplingConfig(max_new_tokens=int(max_tokens),
                                               temperature=float(temperature),
                                               top_p=float(top_p),
                                               stop_tokens=tuple(int(t) for t in stop_tokens),
                                               pad_token=int(pad), cache_dtype=cache_dtype),
               byte_tokens=singles, token_bytes=table,
               token_lengths=lengths)

  def __repr__(self) -> str:
    return (f"PolicyJudge({type(self.model).__name__}, prompt={self.prompt.name!r}, "
            f"temperature={self.sampling.temperature:g}, "
            f"max_tokens={self.sampling.max_new_tokens})")

  def stats(self) -> dict:
    """`LLMJudge.stats()`'s verdict counts over the host calls (`__call__`): rows, requests
    (rows with a prediction and a reference, which get a reply), and per request correct,
    incorrect or unreadable (no verdict word in the reply: False, reported apart);
    no_request: the other rows. Verdicts inside a compiled rollout stay on device and are
    not counted (no callback)."""
    with self._lock:
      return dict(self._counts)

  def state(self) -> tuple:
    """The rollout's judge argument: (model, token bytes [V, K], token lengths [V])."""
    return self.model, jnp.asarray(self.token_bytes), jnp.asarray(self.token_lengths)

  # -- the prompt --

  def pieces(self, references: int) -> tuple[tuple[int, ...], ...]:
    """Token ids of the static text around the fields for `references` reference slots:
    [before question, before reference 1, before reference 2, ..., before prediction,
    after prediction]."""
    if references not in self._pieces:
      names = ["Q"] + [f"R{k}" for k in range(references)] + ["P"]
      marks = {n: _SENTINEL.format(n) for n in names}
      messages = self.prompt.messages(marks["Q"], marks["P"],
                                      [marks[f"R{k}"] for k in range(references)])
      text = render_chat(self.tokenizer, messages)
      order = ["Q"] + [f"R{k}" for k in range(references)] + ["P"]
      texts, rest = [], text
      for name in order:
        if rest.count(marks[name]) != 1:
          raise ValueError(f"PolicyJudge: the chat template does not render the judge's "
                           f"{name} field exactly once ({text[:200]!r})")
        head, rest = rest.split(marks[name])
        texts.append(head)
      texts.append(rest)
      encode = lambda s: tuple(self.tokenizer.encode(s, add_special_tokens=False))
      self._pieces[references] = tuple(encode(s) for s in texts)
    return self._pieces[references]

  def prompt_ids(self, question_BxLq: Array, answer_BxA: Array,
                 references_BxRxLa: Array) -> tuple[Array, Array, Array]:
    """(ids [B, L], mask [B, L], answerable [B]) of the judge's prompt for byte-id fields
    (-1 padded; a reference row starting with -1 is unused). The first
    `len(self.pieces(R)[0])` tokens are every row's (the system prompt): `verdicts` runs
    them once."""
    batch, count = references_BxRxLa.shape[:2]
    if count < 1:
      raise ValueError(f"PolicyJudge.prompt_ids: references [B, R, La] need R >= 1, got "
                       f"{references_BxRxLa.shape}")
    pieces = self.pieces(count)
    table = jnp.asarray(self.byte_tokens, jnp.int32)
    lines = jax.vmap(one_line_bytes)

    def field(bytes_BxL):
      normal = lines(bytes_BxL.astype(jnp.int32))
      return jnp.where(normal >= 0, table[jnp.maximum(normal, 0)], self.sampling.pad_token), \
          normal >= 0

    def static(piece, shown_B):
      ids = jnp.broadcast_to(jnp.asarray(piece, jnp.int32), (batch, len(piece)))
      return ids, jnp.broadcast_to(shown_B[:, None], ids.shape)

    question, question_mask = field(question_BxLq)
    answer, answer_mask = field(answer_BxA)
    refs = jax.vmap(lines)(references_BxRxLa.astype(jnp.int32))        # [B, R, La]
    used = (references_BxRxLa[..., 0] >= 0) & (refs[..., 0] >= 0)
    order = jnp.argsort(~used, axis=-1, stable=True)                   # used first, in order
    refs = jnp.take_along_axis(refs, order[..., None], axis=1)
    used = jnp.take_along_axis(used, order, axis=1)
    always = jnp.ones(batch, bool)
    parts = [static(pieces[0], always), (question, question_mask), static(pieces[1], always)]
    for k in range(count):
      if k:
        parts.append(static(pieces[k + 1], used[:, k]))
      ref = refs[:, k]
      parts.append((jnp.where(ref >= 0, table[jnp.maximum(ref, 0)], self.sampling.pad_token),
                    (ref >= 0) & used[:, k, None]))
    parts += [static(pieces[count + 1], always), (answer, answer_mask),
              static(pieces[count + 2], always)]
    ids = jnp.concatenate([p[0] for p in parts], axis=1)
    mask = jnp.concatenate([p[1] for p in parts], axis=1)
    answerable = jnp.any(answer_mask, -1) & used[:, 0]
    return ids, mask, answerable

  # -- the verdict --

  def verdicts(self, state: tuple, question_BxLq: Array, answer_BxA: Array,
               references_BxRxLa: Array, key: Array) -> Array:
    """bool [B] inside a traced program; `state` is `self.state()`."""
    correct, _, answerable = self.readings(state, question_BxLq, answer_BxA,
                                           references_BxRxLa, key)
    return correct & answerable

  def readings(self, state: tuple, question_BxLq: Array, answer_BxA: Array,
               references_BxRxLa: Array, key: Array) -> tuple[Array, Array, Array]:
    """(correct [B], unreadable [B], answerable [B]) inside a traced program: each reply
    read by `reply_reading`; a row that is not answerable is False whatever its reply."""
    model, token_bytes, token_lengths = state
    reply, answerable = self._generate(model, question_BxLq, answer_BxA, references_BxRxLa,
                                       key)
    text = reply_bytes(reply.tokens, reply.lengths, token_bytes, token_lengths,
                       self.sampling.stop_tokens)
    correct, unreadable = reply_reading(text)
    return correct, unreadable, answerable

  def _generate(self, model, question_BxLq, answer_BxA, references_BxRxLa, key):
    """(the sampler's Generation, answerable [B]); the shared system prompt is prefilled
    once for the batch, then each row's case is appended after it."""
    ids, mask, answerable = self.prompt_ids(question_BxLq, answer_BxA, references_BxRxLa)
    shared = len(self.pieces(references_BxRxLa.shape[1])[0])
    batch, length = ids.shape
    state = sampler.prefill_shared(model, ids[0, :shared], batch,
                                   length + self.sampling.max_new_tokens,
                                   jnp.dtype(self.sampling.cache_dtype))
    state, logits = sampler.append(model, state, ids[:, shared:],
                                   mask[:, shared:].astype(jnp.int32))
    return sampler.decode(model, state, logits, key, self.sampling), answerable

  def replies(self, question_BxLq, answer_BxA, references_BxRxLa, key=None) -> list[str]:
    """The judge's replies as text (host; for inspection and tests)."""
    key = jax.random.PRNGKey(0) if key is None else key
    tokens, lengths = _generate(self, self.state(), *map(jnp.asarray, (
        question_BxLq, answer_BxA, references_BxRxLa)), key)
    stops = set(self.sampling.stop_tokens)
    return [self.tokenizer.decode([t for t in row[:n] if t not in stops],
                                  skip_special_tokens=True)
            for row, n in zip(np.asarray(tokens).tolist(), np.asarray(lengths).tolist())]

  def __call__(self, question_BxLq, answer_BxA, references_BxRxLa, key=None) -> np.ndarray:
    """bool [B] from -1-padded byte ids (the host judge's signature), one jitted call;
    its verdicts are counted in `stats()`."""
    key = jax.random.PRNGKey(0) if key is None else key
    correct, unreadable, answerable = map(np.asarray, _readings(
        self, self.state(), *map(jnp.asarray, (question_BxLq, answer_BxA, references_BxRxLa)),
        key))
    with self._lock:
      counts = self._counts
      counts["rows"] += len(answerable)
      counts["requests"] += int(answerable.sum())
      counts["no_request"] += int((~answerable).sum())
      counts["unreadable"] += int((answerable & unreadable).sum())
      counts["correct"] += int((answerable & correct).sum())
      counts["incorrect"] += int((answerable & ~correct & ~unreadable).sum())
    return correct & answerable


def _jit(fn):
  # The judge's policy rides in `state()` as the pytree a module is (a frozen policy: only
  # read, no dropout), so `jax.jit` takes it without `nnx.jit`'s graph walk per verdict.
  return jax.jit(fn, static_argnums=0)


@functools.cache
def _compiled():
  readings = _jit(lambda judge, state, q, a, r, key: judge.readings(state, q, a, r, key))

  def generate(judge, state, q, a, r, key):
    out, _ = judge._generate(state[0], q, a, r, key)
    return out.tokens, out.lengths
  return readings, _jit(generate)


def _readings(*args):
  return _compiled()[0](*args)


def _generate(*args):
  return _compiled()[1](*args)
