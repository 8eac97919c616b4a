"""A resume reports every key that changes what the run reads or computes: the data folder
and its build, the model folder (tokenizer and processor), the mesh; only the run's own
folder, logging, checkpoint cadence, evaluation and fault injection pass silently."""

from jaxspatial.train import config_changes

SAVED = {"workdir": "/runs/a", "seed": 0, "data.data_dir": "/data/v1", "data.build": "synthetic",
         "model.checkpoint": "/models/qwen", "mesh.data": -1, "mesh.fsdp": 1,
         "log_every": 10, "checkpoint.every": 50, "faults.kill_after_step": -1}


def test_what_the_run_reads_and_the_mesh_are_changes():
  now = dict(SAVED, **{"data.data_dir": "/data/v2", "data.build": "scannet",
                       "model.checkpoint": "/models/other", "mesh.fsdp": 2})
  assert config_changes(SAVED, now) == [
      "data.build: 'synthetic' -> 'scannet'", "data.data_dir: '/data/v1' -> '/data/v2'",
      "mesh.fsdp: 1 -> 2", "model.checkpoint: '/models/qwen' -> '/models/other'"]
  allowed = ("data.data_dir", "data.build", "model.checkpoint", "mesh")
  assert config_changes(SAVED, now, allowed) == []


def test_the_runs_own_folder_logging_cadence_and_faults_pass():
  now = dict(SAVED, **{"workdir": "/runs/b", "log_every": 1, "checkpoint.every": 5,
                       "faults.kill_after_step": 3})
  assert config_changes(SAVED, now) == []
