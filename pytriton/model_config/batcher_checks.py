"""A dynamic batcher's settings checked as Triton checks them when it loads a model, in its words."""

from __future__ import annotations

from typing import Dict, Optional

from pytriton.model_config.common import DynamicBatcher, QueuePolicy, TimeoutAction


def batcher_refusal(model_name: str, batcher: DynamicBatcher) -> Optional[str]:
    """Why Triton would refuse to load a model with these queue policies and ordering (None: it would not).

    Triton 2.51 refuses `preserve_ordering` with more than one priority level, or with a queue policy that
    DELAYs timed-out requests (`model_config_utils.cc`); a negative size or timeout is no uint64 to it.
    """
    policies = _policies(batcher)
    for where, policy in policies.items():
        for field in ("max_queue_size", "default_timeout_microseconds"):
            value = getattr(policy, field)
            if value < 0:
                return f"{where}.{field} must be >= 0, got {value} for {model_name}"
    if not batcher.preserve_ordering:
        return None
    if batcher.priority_levels > 1:
        return f"Only one priority level is allowed when 'preserve_ordering' is true for {model_name}"
    for policy in policies.values():
        if policy.default_timeout_microseconds != 0 and policy.timeout_action == TimeoutAction.DELAY:
            return (
                "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for " + model_name
            )
    return None


def _policies(batcher: DynamicBatcher) -> Dict[str, QueuePolicy]:
    """The batcher's queue policies, each by where it is set ("default_queue_policy", "priority_queue_policy[1]")."""
    policies: Dict[str, QueuePolicy] = {}
    if batcher.default_queue_policy is not None:
        policies["default_queue_policy"] = batcher.default_queue_policy
    for level, policy in (batcher.priority_queue_policy or {}).items():
        policies[f"priority_queue_policy[{level}]"] = policy
    return policies
