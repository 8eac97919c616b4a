"""The geometry stand-in for VGGT features on synthetic scenes."""

import numpy as np

from data_pipelines.synthetic.stand_in_features import GeometryStandInExtractor


def test_stand_in_features_are_deterministic_and_geometric():
  from data_pipelines.synthetic import make_sample, SampleConfig
  sample = make_sample("train", 2, "around", SampleConfig(num_points=20_000, width=96, height=72))
  intrinsics = np.stack([np.asarray(sample.cameras.fx), np.asarray(sample.cameras.fy),
                         np.asarray(sample.cameras.cx), np.asarray(sample.cameras.cy)], 1)
  extractor = GeometryStandInExtractor(grid=8, channels=32)
  features = extractor(sample.depth, np.asarray(sample.cameras.world_from_camera), intrinsics)
  assert features.shape == (len(sample.depth), 5 + 64, 32)
  again = extractor(sample.depth, np.asarray(sample.cameras.world_from_camera), intrinsics)
  np.testing.assert_array_equal(features, again)
  # Different views of the scene give different features; the same view the same.
  assert not np.allclose(features[0], features[1])
  assert np.linalg.norm(features, axis=-1).min() > 1e-3  # no zero tokens: cosines defined
