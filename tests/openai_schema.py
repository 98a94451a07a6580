"""JSON schemas of the response bodies OpenAI publishes (its OpenAPI document, openai/openai-openapi), compacted.

Each object lists the properties OpenAI's schema gives it, with their types, enums and required names;
`additionalProperties: false` catches a misspelt or invented field. Written out here so that no test needs
the network.
"""

from __future__ import annotations

from typing import Any, Dict

FINISH_REASONS = ["stop", "length", "tool_calls", "content_filter", "function_call"]
_NULLABLE_STRING = {"type": ["string", "null"]}

USAGE: Dict[str, Any] = {
    "type": "object",
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {
        "prompt_tokens": {"type": "integer", "minimum": 0},
        "completion_tokens": {"type": "integer", "minimum": 0},
        "total_tokens": {"type": "integer", "minimum": 0},
        "prompt_tokens_details": {"type": "object"},
        "completion_tokens_details": {"type": "object"},
    },
    "additionalProperties": False,
}
_ID_TIME_MODEL = {
    "id": {"type": "string", "minLength": 1},
    "created": {"type": "integer", "minimum": 0},
    "model": {"type": "string"},
    "system_fingerprint": _NULLABLE_STRING,
    "service_tier": _NULLABLE_STRING,
}

CHAT_COMPLETION: Dict[str, Any] = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        **_ID_TIME_MODEL,
        "object": {"const": "chat.completion"},
        "usage": USAGE,
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "message", "finish_reason", "logprobs"],
                "properties": {
                    "index": {"type": "integer", "minimum": 0},
                    "finish_reason": {"enum": FINISH_REASONS},
                    "logprobs": {"type": ["object", "null"]},
                    "message": {
                        "type": "object",
                        "required": ["role", "content", "refusal"],
                        "properties": {
                            "role": {"const": "assistant"},
                            "content": _NULLABLE_STRING,
                            "refusal": _NULLABLE_STRING,
                            "tool_calls": {"type": "array"},
                            "annotations": {"type": "array"},
                            "audio": {"type": ["object", "null"]},
                            "function_call": {"type": ["object", "null"]},
                        },
                        "additionalProperties": False,
                    },
                },
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
}

CHAT_CHUNK: Dict[str, Any] = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        **_ID_TIME_MODEL,
        "object": {"const": "chat.completion.chunk"},
        "usage": {"anyOf": [USAGE, {"type": "null"}]},
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "delta", "finish_reason"],
                "properties": {
                    "index": {"type": "integer", "minimum": 0},
                    "finish_reason": {"enum": [*FINISH_REASONS, None]},
                    "logprobs": {"type": ["object", "null"]},
                    "delta": {
                        "type": "object",
                        "properties": {
                            "role": {"enum": ["developer", "system", "user", "assistant", "tool"]},
                            "content": _NULLABLE_STRING,
                            "refusal": _NULLABLE_STRING,
                            "tool_calls": {"type": "array"},
                            "function_call": {"type": "object"},
                        },
                        "additionalProperties": False,
                    },
                },
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
}

COMPLETION: Dict[str, Any] = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        **_ID_TIME_MODEL,
        "object": {"const": "text_completion"},
        "usage": {"anyOf": [USAGE, {"type": "null"}]},
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "text", "logprobs", "finish_reason"],
                "properties": {
                    "index": {"type": "integer", "minimum": 0},
                    "text": {"type": "string"},
                    "logprobs": {"type": ["object", "null"]},
                    "finish_reason": {"enum": ["stop", "length", "content_filter", None]},
                },
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
}

EMBEDDINGS: Dict[str, Any] = {
    "type": "object",
    "required": ["object", "data", "model", "usage"],
    "properties": {
        "object": {"const": "list"},
        "model": {"type": "string"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "embedding", "object"],
                "properties": {
                    "index": {"type": "integer", "minimum": 0},
                    "object": {"const": "embedding"},
                    "embedding": {"anyOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]},
                },
                "additionalProperties": False,
            },
        },
        "usage": {
            "type": "object",
            "required": ["prompt_tokens", "total_tokens"],
            "properties": {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}},
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}

MODEL: Dict[str, Any] = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
    },
    "additionalProperties": False,
}

MODEL_LIST: Dict[str, Any] = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": MODEL}},
    "additionalProperties": False,
}

ERROR: Dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string", "minLength": 1},
                "type": {"type": "string"},
                "param": _NULLABLE_STRING,
                "code": _NULLABLE_STRING,
            },
            "additionalProperties": False,
        }
    },
    "additionalProperties": False,
}
