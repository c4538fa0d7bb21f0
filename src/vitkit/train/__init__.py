"""Training: recipes, optimisers and schedules, EMA, the loop, checkpoints, distributed set-up.

>>> from vitkit.train import load_recipe, train
>>> results = train(load_recipe("fmnist-fast"), "runs/fmnist")      # doctest: +SKIP
"""
from .evaluate import evaluate, evaluate_checkpoint
from .optim import EMA, Schedule, build_optimizer, param_groups
from .recipe import Recipe, apply_overrides, list_recipes, load_recipe
from .step import TrainStep, classification_loss
from .trainer import Trainer, TrainingDiverged, train

__all__ = ["EMA", "Recipe", "Schedule", "TrainStep", "Trainer", "TrainingDiverged", "apply_overrides",
           "build_optimizer", "classification_loss", "evaluate", "evaluate_checkpoint", "list_recipes",
           "load_recipe", "param_groups", "train"]
