"""Stages: one module (or stage package) per registered stage, each exposing ``run(config)``."""
