"""Peak host memory while loading checkpoints tensor by tensor: a Qwen2.5-VL of over 200 MB
and a Qwen3-VL-4B-shaped one (4.4B parameters, random bfloat16 weights, sharded).

    python -m benchmarks.loading_bench [--rows qwen2_5_vl qwen3_vl_4b]

Cost: about three minutes, 1.5 GB + 8.5 GB of disk in temporary folders and 12 GB of memory.
Row qwen2_5_vl: a model with a 64k x 1024 embedding and an untied LM head (two 268 MB
tensors), saved by transformers as shards of one large tensor each. Row qwen3_vl_4b:
Qwen3-VL-4B's shapes (36 layers, hidden 2560, vocab 151936, a 24-block vision tower with
three DeepStack mergers) written shard by shard (at most 2 GB each), loaded with bfloat16
parameters. A fresh process loads each with `jaxspatial.models.load_model` (the family
from config.json) while a thread samples its resident memory every 2 ms. Reported: the
parameters' bytes, the largest shard, the peak resident memory above the interpreter's
baseline, and the transient overhead (peak minus what the loaded parameters occupy)
against 1.5x the largest shard.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

LOADER = r"""
import json, sys, threading, time, psutil
process = psutil.Process()
import jax, numpy as np
from flax import nnx
from jaxspatial.models import load_model
jax.block_until_ready(jax.numpy.zeros(1))
baseline = process.memory_info().rss
peak, done = [baseline], [False]
def sample():
  while not done[0]:
    peak[0] = max(peak[0], process.memory_info().rss)
    time.sleep(0.002)
# A daemon: a loading error must end the process, not leave the sampler running.
thread = threading.Thread(target=sample, daemon=True); thread.start()
start = time.perf_counter()
try:
  model = load_model(sys.argv[1], param_dtype=sys.argv[2])
finally:
  done[0] = True
seconds = time.perf_counter() - start
thread.join()
params = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
print(json.dumps(dict(baseline=baseline, peak=peak[0], after=process.memory_info().rss,
                      params=params, seconds=seconds)))
"""


def qwen2_5_vl(folder: str) -> str:
  """A transformers Qwen2.5-VL with two 268 MB tensors, shards of one tensor each."""
  import transformers  # pylint: disable=import-outside-toplevel
  config = transformers.Qwen2_5_VLConfig(
      text_config=dict(vocab_size=65536, hidden_size=1024, intermediate_size=2048,
                       num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                       rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
                       tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
      vision_config=dict(depth=1, hidden_size=64, intermediate_size=128, num_heads=2,
                         out_hidden_size=1024, fullatt_block_indexes=[0]),
      image_token_id=65530, video_token_id=65531, vision_start_token_id=65532,
      vision_end_token_id=65533, tie_word_embeddings=False)
  model = transformers.Qwen2_5_VLForConditionalGeneration(config)
  model.save_pretrained(folder, max_shard_size="300MB")
  return "float32"


def qwen3_vl_4b(folder: str) -> str:
  """Qwen3-VL-4B's config.json and random bfloat16 shards (at most 2 GB each) with an
  index, written one shard at a time."""
  import ml_dtypes  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
  from jaxspatial.models.qwen3_vl import Qwen3VLConfig  # pylint: disable=import-outside-toplevel
  from jaxspatial.models.qwen3_vl.config import TextConfig, VisionConfig  # pylint: disable=import-outside-toplevel
  from jaxspatial.models.hf import hf_key  # pylint: disable=import-outside-toplevel
  from jaxspatial.models.qwen3_vl.hf_params import checkpoint_shapes  # pylint: disable=import-outside-toplevel
  config = Qwen3VLConfig(
      text=TextConfig(vocab_size=151936, hidden_size=2560, intermediate_size=9728,
                      num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=128, rope_theta=5e6, mrope_section=(24, 20, 20),
                      tie_word_embeddings=True),
      vision=VisionConfig(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16,
                          out_hidden_size=2560, num_position_embeddings=2304,
                          deepstack_visual_indexes=(5, 11, 17)))
  root = pathlib.Path(folder)
  (root / "config.json").write_text(json.dumps(config.to_hf()))
  tile = np.random.default_rng(0).normal(0, 0.02, 1 << 20).astype(ml_dtypes.bfloat16)
  limit, shard, size, weight_map, names = 2 << 30, {}, 0, {}, []

  def flush(tensors):
    name = f"model-{len(names) + 1:05d}.safetensors"
    save_file(tensors, str(root / name), metadata={"format": "pt"})
    weight_map.update({key: name for key in tensors})
    names.append(name)

  for canonical, shape in checkpoint_shapes(config).items():
    count = int(np.prod(shape))
    value = np.resize(tile, count).reshape(shape)
    if shard and size + value.nbytes > limit:
      flush(shard)
      shard, size = {}, 0
    shard[hf_key(canonical)] = value
    size += value.nbytes
  flush(shard)
  (root / "model.safetensors.index.json").write_text(json.dumps(
      {"metadata": {}, "weight_map": weight_map}))
  return "bfloat16"


ROWS = {"qwen2_5_vl": qwen2_5_vl, "qwen3_vl_4b": qwen3_vl_4b}


def measure(row: str) -> None:
  with tempfile.TemporaryDirectory() as folder:
    param_dtype = ROWS[row](folder)
    shards = sorted(pathlib.Path(folder).glob("*.safetensors"))
    total = sum(s.stat().st_size for s in shards)
    largest = max(s.stat().st_size for s in shards)
    result = subprocess.run([sys.executable, "-c", LOADER, folder, param_dtype],
                            capture_output=True, text=True, check=True)
    stats = json.loads(result.stdout.strip().splitlines()[-1])
  mb = 1 / 2 ** 20
  rise = stats["peak"] - stats["baseline"]
  transient = stats["peak"] - stats["baseline"] - stats["params"]
  print(f"[{row}] checkpoint: {total * mb:.0f} MB in {len(shards)} shard(s), largest "
        f"{largest * mb:.0f} MB")
  print(f"[{row}] loaded parameters ({param_dtype}): {stats['params'] * mb:.0f} MB in "
        f"{stats['seconds']:.2f} s")
  print(f"[{row}] peak resident memory above baseline: {rise * mb:.0f} MB")
  print(f"[{row}] transient overhead (peak - baseline - parameters): {transient * mb:.0f} MB "
        f"= {transient / largest:.2f}x the largest shard (target < 1.5x)\n")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
  for row in parser.parse_args(argv).rows:
    measure(row)


if __name__ == "__main__":
  main()
