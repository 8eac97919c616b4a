"""`reading_jit` computes what `nnx.jit` computes for a program that reads a model, RNG
streams (dropout) included, and keeps no parameter writes."""

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspatial.models import reading_jit


class Net(nnx.Module):
  def __init__(self, rngs):
    self.linear = nnx.Linear(4, 4, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)

  def __call__(self, x):
    return self.dropout(self.linear(x))


def test_outputs_and_dropout_streams_follow_nnx_jit():
  x = jnp.arange(8.0).reshape(2, 4)
  ours, theirs = Net(nnx.Rngs(0)), Net(nnx.Rngs(0))
  fast, reference = reading_jit(lambda m, x: m(x)), nnx.jit(lambda m, x: m(x))
  for _ in range(3):  # each call draws a new mask: the streams must advance alike
    np.testing.assert_array_equal(fast(ours, x), reference(theirs, x))
  np.testing.assert_array_equal(ours.dropout.rngs.count[...],
                                theirs.dropout.rngs.count[...])


def test_a_parameter_write_inside_is_not_kept():
  net = Net(nnx.Rngs(0))
  before = np.asarray(net.linear.bias[...])

  def write(m, x):
    m.linear.bias[...] = m.linear.bias[...] + 1.0
    return x

  reading_jit(write)(net, jnp.zeros(4))
  np.testing.assert_array_equal(net.linear.bias[...], before)


def test_lower_gives_the_program():
  net = Net(nnx.Rngs(0))
  text = reading_jit(lambda m, x: m.linear(x)).lower(net, jnp.zeros((1, 4))).as_text()
  assert "dot" in text
