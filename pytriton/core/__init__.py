"""The serving engine: model registry, scheduler, instances, cache and statistics."""
