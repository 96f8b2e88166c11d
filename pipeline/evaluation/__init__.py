"""Evaluation of a trained checkpoint on one device: test and extra-set perplexity, every kept
checkpoint, text samples, lm-evaluation-harness tasks."""
