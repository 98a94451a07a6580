"""The API categories that restricted-API rules name (options/access.py) and each route belongs to."""

from __future__ import annotations

import enum


class Category(enum.Enum):
    """The API groups a restriction names, as Triton spells them."""

    HEALTH = "health"
    METADATA = "metadata"
    INFERENCE = "inference"
    SHARED_MEMORY = "shared-memory"
    MODEL_CONFIG = "model-config"
    MODEL_REPOSITORY = "model-repository"
    STATISTICS = "statistics"
    TRACE = "trace"
    LOGGING = "logging"
    CUSTOM = "custom"  # pytriton's own: the user's routes and mounted apps on the HTTP port (options/routes.py)
