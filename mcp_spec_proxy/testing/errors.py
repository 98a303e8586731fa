"""The errors the scripted model server raises on purpose; each becomes an HTTP error there."""

from __future__ import annotations


class ScriptedModelError(Exception):
    """Base of the errors the scripted model server raises on purpose.

    ScriptedModelError
    ├── InvalidChatRequest   the body is not a chat-completions request (answered 400)
    ├── InvalidEmbeddingRequest  the body is not an embeddings request (answered 400)
    └── ScriptExhausted      a `Scripted` policy has no reply left (answered 500)
    """


class InvalidChatRequest(ScriptedModelError):
    """The request body is not a chat-completions request."""


class InvalidEmbeddingRequest(ScriptedModelError):
    """The request body is not an embeddings request."""


class ScriptExhausted(ScriptedModelError):
    """A `Scripted` policy was asked for more replies than it holds."""
