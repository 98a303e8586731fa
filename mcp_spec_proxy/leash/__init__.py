"""LEASH: when not to trust the weak model, by nearest neighbours among past successes and failures.

Encoders (`encoders.py`) turn tasks and steps into unit vectors; banks (`bank.py`; on disk,
`persistent.py` over `storage.py`'s files) store them with success/failure labels in FAISS; the
decision layers (`layers.py`) use both. Errors:

    ProxyError
    └── LeashError            LEASH cannot do what was asked
        ├── EncoderError      an encoder failed (endpoint, shape, missing hidden states)
        └── BankError         a bank cannot be loaded or saved (names the files; never replaced)
            └── BankMismatch  the bank was made by another encoder, or is of another kind
"""

from mcp_spec_proxy.leash.bank import (
    LABELS,
    SOURCES,
    Bank,
    BankError,
    BankMismatch,
    Kind,
    Label,
    Neighbour,
    Source,
)
from mcp_spec_proxy.leash.encoders import (
    EmbeddingEncoder,
    Encoder,
    EncoderError,
    EncoderInfo,
    HashingEncoder,
    HiddenStateEncoder,
    LeashError,
    StepView,
    step_text,
    task_text,
)

__all__ = [
    "LABELS",
    "SOURCES",
    "Bank",
    "BankError",
    "BankMismatch",
    "EmbeddingEncoder",
    "Encoder",
    "EncoderError",
    "EncoderInfo",
    "HashingEncoder",
    "HiddenStateEncoder",
    "Kind",
    "Label",
    "LeashError",
    "Neighbour",
    "Source",
    "StepView",
    "step_text",
    "task_text",
]
