"""Peak host memory while loading a Qwen2.5-VL checkpoint of over 200 MB, tensor by tensor.

    python -m benchmarks.loading_bench

Cost: about a minute and 1.5 GB of disk in a temporary folder. A model with a 64k x 1024
embedding and an untied LM head (two 268 MB tensors) is saved as shards of one large
tensor each; a fresh process then loads it with `Qwen25VL.from_pretrained` while a thread
samples its resident memory every 2 ms. Reported: the parameters' bytes, the largest shard,
the peak resident memory above the interpreter's baseline, and the transient overhead
(peak minus what the loaded parameters occupy) against 1.5x the largest shard.
"""

from __future__ import annotations

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
from jaxspatial.models.qwen2_5_vl import Qwen25VL
jax.block_until_ready(jax.numpy.zeros(1))
baseline = process.memory_info().rss
peak, done = [baseline], [False]
def sample():
  while not done[0]:
    peak[0] = max(peak[0], process.memory_info().rss)
    time.sleep(0.002)
thread = threading.Thread(target=sample); thread.start()
start = time.perf_counter()
model = Qwen25VL.from_pretrained(sys.argv[1])
seconds = time.perf_counter() - start
done[0] = True; thread.join()
params = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
print(json.dumps(dict(baseline=baseline, peak=peak[0], after=process.memory_info().rss,
                      params=params, seconds=seconds)))
"""


def main() -> None:
  import transformers  # pylint: disable=import-outside-toplevel
  with tempfile.TemporaryDirectory() as folder:
    config = transformers.Qwen2_5_VLConfig(
        text_config=dict(vocab_size=65536, hidden_size=1024, intermediate_size=2048,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                         rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
        vision_config=dict(depth=1, hidden_size=64, intermediate_size=128, num_heads=2,
                           out_hidden_size=1024),
        image_token_id=65530, video_token_id=65531, vision_start_token_id=65532,
        vision_end_token_id=65533, tie_word_embeddings=False)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config)
    model.save_pretrained(folder, max_shard_size="300MB")
    del model
    shards = sorted(pathlib.Path(folder).glob("*.safetensors"))
    total = sum(s.stat().st_size for s in shards)
    largest = max(s.stat().st_size for s in shards)
    result = subprocess.run([sys.executable, "-c", LOADER, folder], capture_output=True,
                            text=True, check=True)
    stats = json.loads(result.stdout.strip().splitlines()[-1])
  mb = 1 / 2 ** 20
  rise = stats["peak"] - stats["baseline"]
  transient = stats["peak"] - stats["baseline"] - stats["params"]
  print(f"checkpoint: {total * mb:.0f} MB in {len(shards)} shard(s), largest {largest * mb:.0f} MB")
  print(f"loaded parameters: {stats['params'] * mb:.0f} MB in {stats['seconds']:.2f} s")
  print(f"peak resident memory above baseline: {rise * mb:.0f} MB")
  print(f"transient overhead (peak - baseline - parameters): {transient * mb:.0f} MB "
        f"= {transient / largest:.2f}x the largest shard (target < 1.5x)")


if __name__ == "__main__":
  main()
