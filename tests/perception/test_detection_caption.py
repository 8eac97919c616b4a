"""GroundingDINO's caption (`detection.caption`): the labels as written by default (PERIA
passes the question's casing through), lower-cased as an option, and a label spelling a
special token never splits the labels' token spans."""

from jaxspatial.perception import detection as det

BERT_SPECIALS = ("[MASK]", "[CLS]", "[SEP]", "[PAD]", "[UNK]")


def test_the_caption_keeps_the_labels_casing_by_default():
  assert det.DetectionConfig().lowercase_prompt is False
  assert det.caption(["Red car", "CAT", "dog"]) == "Red car. CAT. dog."
  assert det.caption(["Red car", "CAT"], lowercase=True) == "red car. cat."
  assert det.caption(["Caf\u00e9 TABLE"], lowercase=True) == "caf\u00e9 table."


def test_a_label_spelling_a_special_token_is_text_either_way():
  labels = ["[SEP] chair", "a [CLS][SEP] b", "[sep]", "<s>"]
  assert det.caption(labels, special_tokens=BERT_SPECIALS) == (
      "[sep] chair. a [cls][sep] b. [sep]. <s>.")
  assert det.caption(labels, lowercase=True, special_tokens=BERT_SPECIALS) == (
      "[sep] chair. a [cls][sep] b. [sep]. <s>.")
  assert det.caption(["Red [SEP]"]) == "Red [SEP]."  # no tokenizer named: nothing to avoid
