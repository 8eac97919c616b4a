"""A training run's checkpoint as a Hugging Face policy folder (what `launch.export` calls):
the folder `launch.serve`, `launch.eval --checkpoint` and `models.load_policy` read, and
transformers' `from_pretrained` loads.

    exported = export_checkpoint(config, "outputs/demo_policy")          # the latest step
    exported = export_checkpoint(config, out, checkpoint="runs/act3d", step=400)
    exported = export_checkpoint(config, out, best=True)                 # the best RL step

The run's policy is rebuilt and its parameters restored exactly as `launch.eval` restores
them (`Trainer.restore`: the recipe's module on the config's mesh, the step verified against
its fingerprints), then the recipe's `exported_policy` (the family model, the tokenizer the
run trained with, its chat format, the folder it started from) is written by
`models.policy_folder.write_policy_folder`: weights with LoRA adapters merged, tokenizer,
image processor config, chat template, generation config, written atomically.
"""

from __future__ import annotations

import dataclasses
import pathlib

import jax
from etils import epath

from jaxspatial.models.policy import FAMILIES
from jaxspatial.models.policy_folder import check_target, write_policy_folder
from jaxspatial.train import Experiment, Trainer, initialize_from_env


@dataclasses.dataclass(frozen=True)
class Exported:
  folder: pathlib.Path   # the Hugging Face folder written
  step: int              # the training step its weights are from
  checkpoint: str        # the step's checkpoint folder
  family: str            # config.json's model_type


def export_checkpoint(config, out, checkpoint: str | None = None, step: int | None = None,
                      best: bool = False, overwrite: bool = False,
                      experiment: Experiment | None = None) -> Exported:
  """Writes the policy of a run's checkpoint (the run in `checkpoint`, a work directory;
  default: the config's `workdir`) to the folder `out`: the latest step, step `step`, or
  the best one (`best`). `experiment`: the recipe's experiment (default: the one the
  config's `recipe` names, built without its training data where the recipe allows).

  Raises FileNotFoundError for a missing run, checkpoint folder or step (naming the path
  and the steps there), ValueError for a recipe whose policy is not a policy family, and
  FileExistsError for an output folder in the way (a non-empty one needs `overwrite`)."""
  import recipes  # pylint: disable=import-outside-toplevel
  initialize_from_env()  # before the recipe's modules start the backend
  if step is not None and best:
    raise ValueError("step and best: give one of them, not both")
  if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
    raise ValueError(f"step: expected an integer >= 0, got {step!r}")
  if not out:
    raise ValueError("the output folder is unset (--out DIR)")
  check_target(out, overwrite)
  name = config.get("recipe")
  if experiment is None:
    if name not in recipes.RECIPES:
      raise ValueError(f"the config's recipe is {name!r}, not a training recipe (one "
                       f"of {sorted(recipes.RECIPES)}): launch.export reads the checkpoints "
                       "of a run launch.train wrote, with its training config")
    cls = recipes.experiment_class(config)
    if cls.exported_policy is Experiment.exported_policy:
      raise ValueError(f"recipe {name!r} ({cls.__name__}) exports no policy: launch.export "
                       f"writes policies of the families {sorted(FAMILIES)}")
    experiment = cls.for_export(config)
  if jax.process_count() > 1:
    raise ValueError("an export runs as one process (it gathers every parameter on "
                     f"this host), not {jax.process_count()}")
  trainer = Trainer(config, experiment)
  restored = trainer.restore(checkpoint, step=step, best=best, for_export=True)
  policy = experiment.exported_policy(trainer.module)
  family = getattr(type(policy.model), "family", None)
  if family not in FAMILIES:
    raise ValueError(f"recipe {name!r}: its policy is a {type(policy.model).__name__}, not "
                     f"one of the policy families {sorted(FAMILIES)}; launch.export writes "
                     "those only")
  where = epath.Path(checkpoint or config.workdir) / "checkpoints" / (
      "best" if best else "latest") / str(restored)
  where = str(where if "://" in str(where) else epath.Path(where).absolute())
  notes = {"recipe": name, "config": config.get("name"), "variant": config.get("variant"),
           "checkpoint": where, "step": restored, "family": family, "source": policy.source}
  folder = write_policy_folder(policy.model, policy.tokenizer, out, chat=policy.chat,
                               source=policy.source, notes=notes, overwrite=overwrite)
  return Exported(folder, restored, where, family)
