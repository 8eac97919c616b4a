"""The perception registry (jaxspatial.perception.TOOLS): PERIA's twelve public tools with
their public arguments, the real PP-OCRv4 behind the OCR entries, the named error of a
tool without its model folder, and name / family selection. The SAM 3 and GroundingDINO
entries run on the tiny models in test_segmentation.py and test_detection.py."""

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from jaxspatial import perception
from jaxspatial.perception import ocr, tools
from jaxspatial.perception.tools import TOOLS, ModelFolderError
from tests.perception.test_ocr import Memo

# peria.md section 1: the five OCR, six SAM 3.1 and one GroundingDINO tools.
PUBLIC = {
    **{name: ("ocr", ("image_index", "bounding_box")) for name in (
        "text_ocr", "formula_ocr", "table_ocr", "text_spotting", "map_text_ocr")},
    "auto_segment": ("sam3", ("image_index",)),
    "bbox_segment": ("sam3", ("image_index", "bounding_box")),
    "text_segment": ("sam3", ("image_index", "text_prompt")),
    "exemplar_segment": ("sam3", ("image_index", "bounding_box")),
    "concept_count": ("sam3", ("image_index", "text_prompt")),
    "presence_check": ("sam3", ("image_index", "text_prompt")),
    "grounding_dino": ("grounding_dino", ("image_index", "question")),
}


@pytest.fixture(autouse=True)
def _no_model_env(monkeypatch):
  for name in tools.MODEL_ENV.values():
    monkeypatch.delenv(name, raising=False)


def test_the_registry_holds_perias_twelve_tools_with_their_public_arguments():
  assert perception.TOOLS is TOOLS
  assert {name: (t.family, t.arguments) for name, t in TOOLS.items()} == PUBLIC
  assert all(t.name == name for name, t in TOOLS.items())
  assert set(tools.FAMILIES) == {"ocr", "sam3", "grounding_dino"}




def test_an_ocr_entry_reads_a_rendered_word_with_pp_ocrv4(monkeypatch):
  canvas = Image.new("RGB", (320, 96), "white")
  ImageDraw.Draw(canvas).text((12, 24), "harbor", fill="black",
                              font=ImageFont.load_default(size=40))
  image = np.asarray(canvas)
  monkeypatch.setattr(tools, "_DEFAULT_OCR", [Memo(ocr.RapidOCRBackend())])
  tool = TOOLS["text_ocr"]  # unbound: the process's PP-OCRv4
  assert tool(image) == {"task": "ocr", "text": "harbor"}
  # image_index is the caller's (it chose the image): accepted, not used.
  text = tool.text(image, image_index=0, bounding_box=[0, 0, 1000, 1000])
  assert text == ocr.run_tool("text_ocr", image, {"bounding_box": [0, 0, 1000, 1000]},
                              tools.default_ocr_backend())
  assert text == ocr.SUCCESS + '{"task":"ocr","text":"harbor"}'
  # A model-written bad argument is the tool's error, as a dict, never an exception.
  assert tool(image, bounding_box="garbage") == {"error": tool.text(image,
                                                                    bounding_box="garbage")}
  assert tool(image, bounding_box="garbage")["error"].startswith(
      "Error executing text_ocr: bounding_box must be")
  assert tool(image, question="cat")["error"].startswith(
      "Error executing text_ocr: unexpected argument 'question'")
  with pytest.raises(ValueError, match=r"text_ocr: expected an image \[H, W, 3\] uint8"):
    tool(image.astype(np.float32))


def test_a_tool_without_its_model_folder_names_the_tool_family_and_ways(monkeypatch):
  image = np.zeros((8, 8, 3), np.uint8)
  message = (r"auto_segment \(family 'sam3'\) needs a SAM 3 model folder and has none: bind "
             r"one \(TOOLS\['auto_segment'\]\.bind\('/path/to/folder'\)\), set "
             r"\$JAXSPATIAL_SAM3_MODEL, pass --models sam3=/path/to/folder to "
             r"launch\.perception_server, or in a recipe set "
             r"--config\.perception\.models\.sam3=/path/to/folder")
  with pytest.raises(ModelFolderError, match=message):
    TOOLS["auto_segment"](image)
  with pytest.raises(ModelFolderError, match=r"grounding_dino \(family 'grounding_dino'\) "
                     r"needs a GroundingDINO model folder"):
    TOOLS["grounding_dino"].host_tool(tokenizer=None)  # fails when built, not per call
  with pytest.raises(ModelFolderError, match=r"family 'sam3': the SAM 3 folder "
                     r"/nowhere/sam3 does not load: .*is not a folder"):
    TOOLS["text_segment"].bind("/nowhere/sam3").text(image, text_prompt="cat")
  monkeypatch.setenv("JAXSPATIAL_SAM3_MODEL", "/nowhere/env")
  with pytest.raises(ModelFolderError, match=r"/nowhere/env does not load"):
    TOOLS["concept_count"].backend()
  with pytest.raises(ValueError, match=r"auto_segment\.bind: expected a model folder or a "
                     "backend, got ''"):
    TOOLS["auto_segment"].bind("")
  with pytest.raises(ValueError, match=r"options \['device'\] are loading options"):
    TOOLS["text_ocr"].bind(tools.default_ocr_backend(), device="cpu")


def test_select_takes_names_and_families_and_binds_folders():
  chosen = tools.select(["text_ocr", "grounding_dino", "sam3"],
                        {"sam3": "/models/sam3", "grounding_dino": "", "ocr": ""})
  assert list(chosen) == ["text_ocr", "grounding_dino", *tools.FAMILIES["sam3"]]
  assert chosen["auto_segment"].source == "/models/sam3"
  assert chosen["text_ocr"].source is None and chosen["grounding_dino"].source is None
  with pytest.raises(ValueError, match=r"unknown perception tool or family 'seal_ocr'"):
    tools.select(["seal_ocr"])
  with pytest.raises(ValueError, match=r"'text_ocr' is named twice"):
    tools.select(["ocr", "text_ocr"])
  with pytest.raises(ValueError, match=r"model folders for unknown families \['sam'\]"):
    tools.select(["ocr"], {"sam": "/x"})


def test_perias_reference_config_calls_the_twelve_tools():
  from configs import peria_or_gigpo  # pylint: disable=import-outside-toplevel
  c = peria_or_gigpo.get_config()
  assert c.perception.tools == tuple(TOOLS)
  assert set(c.perception.models) == set(tools.FAMILIES)
  assert peria_or_gigpo.get_config("cpu").perception.tools == ()
