"""Model resolution (aliases, local dirs, hub ids) and the generator / dual-encoder wrappers."""

from synthq.models.resolve import aliases, register_alias, resolve_device, resolve_model

__all__ = ["aliases", "register_alias", "resolve_device", "resolve_model"]
