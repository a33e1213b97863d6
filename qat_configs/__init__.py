"""Shipped QAT configs (``*.yaml`` package data) and their schema.

``load_config("fp16.yaml")`` resolves a path first, then a shipped name; see ``schema``.
"""

from mcpc.qat_configs.schema import DTYPE_NAMES, QatConfig, load_config, parse_config, shipped_configs

__all__ = ["DTYPE_NAMES", "QatConfig", "load_config", "parse_config", "shipped_configs"]
