"""Drafter training: target-regenerated corpus, anchor-block objective, trainer, evaluation."""
