"""Think3D's scene reconstructed online: the recipe's `reconstruction` block becomes the
agent's host tool, and a compiled Think3D rollout that reconstructs its scenes from the
tasks' input images equals the same rollout on tasks reconstructed on the host beforehand.

The rollout comparison compiles two rollouts (about 40 s on 2 cores): it is a `make
train-checks` test; the default suite checks the same equality for the rollout's first call
and a view (tests/perception/test_perception_rollout.py)."""

import dataclasses

import jax
import numpy as np
import pytest

from configs import think3d_rl
from jaxspatial.perception import reconstruction
from recipes.agents import make_reconstruction


def test_the_recipe_block_builds_the_agents_reconstruction_tool(monkeypatch, tmp_path):
  # pylint: disable=import-outside-toplevel
  from safetensors.torch import save_file
  from tests.perception.test_reconstruction import TinyPi3, install_pi3
  install_pi3(monkeypatch, TinyPi3)
  monkeypatch.setattr(reconstruction, "_LOADED", {})
  save_file({k: v.contiguous() for k, v in TinyPi3().state_dict().items()},
            str(tmp_path / "pi3.safetensors"))
  c = think3d_rl.get_config("cpu")
  assert make_reconstruction(c, "think3d") is None  # backend "": the dataset's clouds
  c.reconstruction.update(backend="pi3", checkpoint=str(tmp_path / "pi3.safetensors"))
  tool = make_reconstruction(c, "think3d")
  assert (tool.num_points, tool.num_views) == (c.data.points, 8)
  assert tool.timeout_s == 600.0 and tool.on_error == "raise"
  with pytest.raises(ValueError, match=r"only Think3D's agent reconstructs its scene, not act3d"):
    make_reconstruction(c, "act3d")
  c.reconstruction.checkpoint = ""
  with pytest.raises(ValueError, match=r"backend 'pi3' needs checkpoint="):
    make_reconstruction(c, "think3d")


@pytest.mark.recipe_checks
def test_a_think3d_rollout_reconstructing_online_equals_one_reconstructed_beforehand():
  # pylint: disable=import-outside-toplevel
  from flax import nnx
  from jaxspatial.models.qwen2_5_vl.model import Qwen25VL
  from jaxspatial.rollout import AgentRollout, tiny
  from tests.perception.test_perception_rollout import think3d_reconstruction_case
  tok = tiny.tokenizer()
  model = Qwen25VL(tiny.model_config(tok), rngs=nnx.Rngs(1))
  reconstructor, dataset, beforehand, agent = think3d_reconstruction_case(size=56, points=8192)
  tool = reconstruction.reconstruction_tool(reconstructor.host_function(8192), 8192, 3)
  run = AgentRollout.create(agent, tok, model, max_turns=3, max_turn_tokens=64)
  online = dataclasses.replace(run, agent=agent.with_reconstruction(tool))
  scripts = [[agent.call_turn("v", 1, 30, 10, ego=True), agent.call_turn("v", 2, -45, 60),
              agent.answer_turn("ok", "B")]] * 2
  key = jax.random.PRNGKey(0)
  got = jax.device_get(online(model, dataset, key, forced=run.forced(scripts)))
  expected = jax.device_get(run(model, beforehand, key, forced=run.forced(scripts)))
  assert tool.stats()["tools/reconstruct/calls"] == 1  # the batch's two scenes, one call
  assert expected.turn_valid.all() and not expected.env_invalid.any()
  np.testing.assert_array_equal(got.images, expected.images)
  np.testing.assert_array_equal(got.tokens, expected.tokens)
  np.testing.assert_allclose(got.logprobs, expected.logprobs, atol=1e-6)
  np.testing.assert_array_equal(got.reward, expected.reward)
  views = np.asarray(got.images[:, 3:5])  # the ego and the global view
  assert ((views != 255).any(-1).mean((-1, -2)) > 0.02).all()  # the reconstruction's
