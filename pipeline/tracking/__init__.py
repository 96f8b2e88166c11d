"""Experiment trackers (logging.wandb.mode, logging.mlflow.enabled): what the run logs, mirrored
from its logging rank to Weights & Biases and MLflow; one tracker run per run folder
(tracking.json)."""
