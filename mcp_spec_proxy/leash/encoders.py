"""LEASH encoders: turn tasks and steps into unit vectors that the banks compare by inner product.

Three encoders share one Protocol, `Encoder`:

* `HashingEncoder` — the offline default: signed feature hashing (blake2b, never Python's
  salted `hash`) of the tool name, argument keys, key=value pairs and word uni/bigrams. The same
  input gives the same vector in every process, so banks outlive restarts.
* `EmbeddingEncoder` — any OpenAI-compatible `POST /v1/embeddings`, through `openai.AsyncOpenAI`.
* `HiddenStateEncoder` — the weak model's own final-layer hidden state of a drafted step, returned
  with its drafting call (SGLang `return_hidden_states`, no extra pass). It cannot encode on
  demand: it converts what arrives with the step. Where a server has no states, `layers.Leash`
  uses its fallback encoder instead (never a second request to the weak model's server).

Every encoder returns float32 arrays of shape (n, dim) with L2-normalised rows; a row with no
features (an empty text) stays the zero vector, which is similar to nothing. `EncoderInfo` is what
a bank records about who made its vectors; a bank refuses vectors from a different encoder.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import anyio
import numpy as np
import openai

from mcp_spec_proxy.errors import ProxyError

EncoderName = Literal["hashing", "embedding", "hidden"]

OBSERVATION_CHARS = 2000
"""Observations longer than this are cut (head and tail kept) before encoding."""
VALUE_CHARS = 500
"""An argument value's canonical JSON longer than this is cut in the key=value feature."""
HASHING_SCHEME = "blake2b-v1"
"""Names the hashing encoder's feature scheme; change it whenever features change, so old banks refuse."""
EMBEDDING_BATCH = 128
"""Inputs per `/v1/embeddings` request."""
THREAD_THRESHOLD_CHARS = 20_000
"""Hashing batches with more input characters than this run in a worker thread, off the event loop."""
REQUEST_EXTRA: dict[str, Any] = {"return_hidden_states": True}
"""`extra_body` that asks SGLang for hidden states with a chat completion (start it with
`--enable-return-hidden-states`); `ChatModel.complete(hidden_states=True)` sends it for `provider: sglang`."""
HIDDEN_MEMORY = 4096
"""Drafted steps whose vectors a `HiddenStateEncoder` remembers for labelling (least recently used go first)."""

_WORD = re.compile(r"\w+")
# Feature groups of a step and their weights: the tool decides most, then the arguments, then what came back.
_TOOL_WEIGHT = 2.0
_ARGS_WEIGHT = 1.0
_ARG_WORDS_WEIGHT = 0.5
_OBSERVATION_WEIGHT = 1.0


class LeashError(ProxyError):
    """LEASH cannot do what was asked (an encoder or a bank failed)."""


class EncoderError(LeashError):
    """An encoder cannot produce vectors: the endpoint failed, answered the wrong shape, or hidden
    states are missing or of the wrong dimension."""


@dataclass(frozen=True)
class StepView:
    """What an encoder sees of one step: the tool, its arguments and (when given) what it returned.

    LEASH's own banks never pass the observation (`steps.view`): a step is judged before it runs."""

    tool: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    observation: str | None = None


@dataclass(frozen=True)
class EncoderInfo:
    """Who made a bank's vectors. `dim == 0` means "not known yet" (an embedding endpoint not asked
    yet); a bank then takes the dimension from disk or from its first vectors."""

    name: EncoderName
    model: str
    dim: int

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model, "dim": self.dim}

    def describe(self) -> str:
        return f"{self.name} encoder '{self.model}' ({self.dim or 'unknown'} dims)"


class Encoder(Protocol):
    """Makes unit vectors of steps and texts; rows are float32 and L2-normalised (zero stays zero)."""

    @property
    def info(self) -> EncoderInfo: ...

    async def encode_steps(self, steps: list[StepView]) -> np.ndarray: ...

    async def encode_texts(self, texts: list[str]) -> np.ndarray: ...


# -- canonical texts ---------------------------------------------------------------------------


def _canonical(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    # Keep the head and the tail: errors and totals tend to sit at the end of an observation.
    head = limit * 3 // 4
    tail = limit - head
    return f"{text[:head]} […{len(text) - limit} chars…] {text[-tail:]}"


def _observation(view: StepView) -> str | None:
    return None if view.observation is None else _truncate(view.observation, OBSERVATION_CHARS)


def step_text(view: StepView) -> str:
    """One canonical text per step: tool, arguments sorted by key, then the (cut) observation."""
    lines = [f"tool: {view.tool}"]
    lines += [f"{key} = {_canonical(view.arguments[key])}" for key in sorted(view.arguments)]
    observation = _observation(view)
    if observation is not None:
        lines.append(f"observation: {observation}")
    return "\n".join(lines)


def task_text(task: str) -> str:
    """A task as encoded: whitespace runs collapsed, so formatting alone never moves a vector."""
    return " ".join(task.split())


def normalise_rows(matrix: np.ndarray) -> np.ndarray:
    """float32 copy with unit rows; an all-zero row stays zero."""
    out = np.array(matrix, dtype=np.float32, copy=True, ndmin=2)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.divide(out, norms, out=out, where=norms > 0)
    return out


# -- hashing -----------------------------------------------------------------------------------


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _word_features(text: str) -> Counter[str]:
    words = _words(text)
    features = Counter(f"w:{w}" for w in words)
    features.update(f"b:{a} {b}" for a, b in itertools.pairwise(words))
    return features


class HashingEncoder:
    """Signed feature hashing into `dim` buckets, keyed by `seed`; deterministic across processes.

    A step is four groups of features, each normalised then weighted (tool 2, arguments 1,
    argument words 0.5, observation 1) so a long observation cannot drown the tool name: a step
    that differs only in one argument value stays closer than the same arguments under another tool.
    """

    def __init__(self, dim: int = 1024, seed: int = 0) -> None:
        if dim < 2:
            raise ValueError(f"HashingEncoder dim must be at least 2, got {dim}")
        if not 0 <= seed < 2**64:
            raise ValueError(f"HashingEncoder seed must be in [0, 2**64), got {seed}")
        self.dim = dim
        self.seed = seed
        self._key = seed.to_bytes(8, "little")

    @property
    def info(self) -> EncoderInfo:
        return EncoderInfo("hashing", f"{HASHING_SCHEME}-seed{self.seed}", self.dim)

    async def encode_steps(self, steps: list[StepView]) -> np.ndarray:
        size = sum(len(s.observation or "") + len(_canonical(dict(s.arguments))) for s in steps)
        return await self._run(self.encode_steps_sync, steps, size)

    async def encode_texts(self, texts: list[str]) -> np.ndarray:
        return await self._run(self.encode_texts_sync, texts, sum(map(len, texts)))

    async def _run(self, fn: Callable[[Any], np.ndarray], items: Any, size: int) -> np.ndarray:
        if size > THREAD_THRESHOLD_CHARS:
            return await anyio.to_thread.run_sync(fn, items)
        return fn(items)

    def encode_steps_sync(self, steps: Sequence[StepView]) -> np.ndarray:
        """The same as `encode_steps`, on the calling thread."""
        out = np.zeros((len(steps), self.dim), dtype=np.float32)
        for row, view in enumerate(steps):
            args: Counter[str] = Counter()
            arg_words: Counter[str] = Counter()
            for key in sorted(view.arguments):
                value = _canonical(view.arguments[key])
                args[f"k:{key}"] += 1
                args[f"kv:{key}={_truncate(value, VALUE_CHARS)}"] += 1
                arg_words.update(_word_features(_truncate(value, OBSERVATION_CHARS)))
            observation = _observation(view)
            groups: list[tuple[float, Counter[str]]] = [
                (_TOOL_WEIGHT, Counter({f"t:{view.tool}": 1})),
                (_ARGS_WEIGHT, args),
                (_ARG_WORDS_WEIGHT, arg_words),
                (_OBSERVATION_WEIGHT, _word_features(observation) if observation else Counter()),
            ]
            for weight, features in groups:
                self._add_group(out[row], features, weight)
        return normalise_rows(out)

    def encode_texts_sync(self, texts: Sequence[str]) -> np.ndarray:
        """The same as `encode_texts`, on the calling thread."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            self._add_group(out[row], _word_features(task_text(text)), 1.0)
        return normalise_rows(out)

    def _add_group(self, row: np.ndarray, features: Counter[str], weight: float) -> None:
        if not features:
            return
        group = np.zeros(self.dim, dtype=np.float64)
        for feature, count in features.items():
            digest = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8, key=self._key).digest(), "little")
            sign = 1.0 if digest >> 63 else -1.0
            # Sub-linear counts: a word repeated fifty times is not fifty times the evidence.
            group[digest % self.dim] += sign * (1.0 + math.log(count))
        norm = float(np.linalg.norm(group))
        if norm > 0:
            row += (group * (weight / norm)).astype(np.float32)


# -- embeddings --------------------------------------------------------------------------------


class EmbeddingEncoder:
    """Vectors from an OpenAI-compatible `/v1/embeddings` endpoint.

    Steps are embedded as `step_text`, tasks as `task_text`. Without `dim`, the first answer sets
    it (`info.dim` is 0 until then; `await probe()` asks at once). Empty texts are not sent: they
    encode to the zero vector. Every failure is an `EncoderError` naming the endpoint.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        dim: int | None = None,
        timeout: float = 30,
        *,
        max_retries: int = 1,
        batch: int = EMBEDDING_BATCH,
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.dim = dim
        self.batch = max(1, batch)
        self._client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key or "not-needed", timeout=timeout, max_retries=max_retries
        )

    @property
    def info(self) -> EncoderInfo:
        return EncoderInfo("embedding", self.model, self.dim or 0)

    async def probe(self) -> EncoderInfo:
        """Ask the endpoint once if the dimension is not known yet; the complete `info`."""
        if not self.dim:
            await self._embed(["dimension probe"])
        return self.info

    async def encode_steps(self, steps: list[StepView]) -> np.ndarray:
        return await self.encode_texts_raw([step_text(s) for s in steps])

    async def encode_texts(self, texts: list[str]) -> np.ndarray:
        return await self.encode_texts_raw([task_text(t) for t in texts])

    async def encode_texts_raw(self, texts: Sequence[str]) -> np.ndarray:
        """Embed `texts` as given (no canonicalisation)."""
        wanted = [i for i, text in enumerate(texts) if text.strip()]
        vectors = await self._embed([texts[i] for i in wanted]) if wanted else None
        if vectors is None and not self.dim:
            await self.probe()
        out = np.zeros((len(texts), self.dim or 0), dtype=np.float32)
        if vectors is not None:
            out[wanted] = vectors
        return out

    async def aclose(self) -> None:
        await self._client.close()

    async def _embed(self, texts: list[str]) -> np.ndarray:
        parts = [await self._request(texts[i : i + self.batch]) for i in range(0, len(texts), self.batch)]
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def _fail(self, problem: str) -> EncoderError:
        return EncoderError(f"embedding endpoint {self.base_url} (model '{self.model}') {problem}")

    async def _request(self, texts: list[str]) -> np.ndarray:
        try:
            response = await self._client.embeddings.create(model=self.model, input=texts, encoding_format="float")
        except openai.APITimeoutError:
            raise self._fail("timed out") from None
        except openai.APIStatusError as exc:
            raise self._fail(f"answered HTTP {exc.status_code}: {str(exc.message)[:300]}") from None
        except openai.APIConnectionError as exc:
            raise self._fail(
                f"cannot be reached: {exc} — is the server running, and does base_url end in /v1?"
            ) from None
        except (openai.APIResponseValidationError, ValueError, TypeError) as exc:
            raise self._fail(f"answered something that is not an embeddings response: {exc}") from None
        data = getattr(response, "data", None)
        if not isinstance(data, list) or len(data) != len(texts):
            got = len(data) if isinstance(data, list) else type(data).__name__
            raise self._fail(f"answered {got} embeddings for {len(texts)} inputs")
        rows: list[Any] = [None] * len(texts)
        for position, item in enumerate(data):
            index = getattr(item, "index", position)
            if not isinstance(index, int) or not 0 <= index < len(texts) or rows[index] is not None:
                raise self._fail(f"answered an embedding with a bad or repeated index {index!r}")
            rows[index] = getattr(item, "embedding", None)
        try:
            matrix = np.array(rows, dtype=np.float32)
        except (TypeError, ValueError):
            raise self._fail("answered embeddings that are not equal-length lists of numbers") from None
        if matrix.ndim != 2 or matrix.shape[1] == 0:
            raise self._fail(f"answered embeddings of shape {matrix.shape}, not one vector per input")
        if self.dim and matrix.shape[1] != self.dim:
            raise self._fail(
                f"answered {matrix.shape[1]}-dim vectors, expected {self.dim} — set dim to the model's dimension"
                " (a bank made with another dimension cannot take them)"
            )
        if not np.isfinite(matrix).all():
            raise self._fail("answered embeddings containing NaN or infinity")
        self.dim = matrix.shape[1]
        return normalise_rows(matrix)


# -- hidden states -----------------------------------------------------------------------------


def _state_key(view: StepView) -> str:
    return f"{view.tool}\n{_canonical(dict(view.arguments))}"


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


class HiddenStateEncoder:
    """The weak model's final-layer hidden state of the last token, from its drafting calls.

    Nothing is encoded on demand: request completions with `extra_body=REQUEST_EXTRA` (or
    `ChatModel.complete(hidden_states=True)`) and pass the vector — or `choices[i].hidden_states`,
    or the choice itself (`from_choice`) — to `from_hidden`. Given the drafted `step`, the vector is
    remembered, and `encode_steps` answers from memory for the steps it has seen (their labels).
    """

    def __init__(self, model: str, dim: int, *, memory: int = HIDDEN_MEMORY) -> None:
        if dim < 1:
            raise ValueError(f"HiddenStateEncoder dim must be the model's hidden size, got {dim}")
        self.model = model
        self.dim = dim
        self._memory = max(1, memory)
        self._seen: OrderedDict[str, np.ndarray] = OrderedDict()

    @property
    def info(self) -> EncoderInfo:
        return EncoderInfo("hidden", self.model, self.dim)

    async def encode_steps(self, steps: list[StepView]) -> np.ndarray:
        """The remembered vectors of drafted steps; a step never drafted here cannot be encoded."""
        rows = [self.recall(view) for view in steps]
        missing = [view.tool for view, row in zip(steps, rows, strict=True) if row is None]
        if missing:
            raise self._no_on_demand(f" (no drafted state for {', '.join(missing[:5])})")
        out = np.zeros((len(steps), self.dim), dtype=np.float32)
        for index, row in enumerate(rows):
            out[index] = row
        return out

    async def encode_texts(self, texts: list[str]) -> np.ndarray:
        raise self._no_on_demand()

    def remember(self, step: StepView, vector: np.ndarray) -> None:
        """Keep a drafted step's (normalised) vector; keyed by tool and arguments, not observation."""
        key = _state_key(step)
        self._seen[key] = self._check(vector)
        self._seen.move_to_end(key)
        while len(self._seen) > self._memory:
            self._seen.popitem(last=False)

    def recall(self, step: StepView) -> np.ndarray | None:
        """The remembered vector of a drafted step (same tool and arguments), else None."""
        return self._seen.get(_state_key(step))

    def _no_on_demand(self, detail: str = "") -> EncoderError:
        return EncoderError(
            f"the hidden-state encoder (model '{self.model}') cannot encode on demand{detail}: hidden states arrive"
            " with the weak model's drafting calls (SGLang return_hidden_states) — pass"
            " them to from_hidden(), or configure leash.encoder: hashing or embedding"
        )

    def from_hidden(
        self, values: Sequence[float] | Sequence[Sequence[float]] | np.ndarray, step: StepView | None = None
    ) -> np.ndarray:
        """The last token's vector of `values`, normalised: shape (dim,), float32.

        `values` is one vector, or a list per token (SGLang may also put the whole prompt's
        vectors first as one nested list); the last vector found at the end is used. With the
        drafted `step`, the vector is also remembered for it (`recall`, `encode_steps`).
        """
        current: Any = values
        for _ in range(4):
            vector: Sequence[Any] | np.ndarray | None
            if isinstance(current, np.ndarray) and current.ndim >= 1 and current.size:
                vector = current if current.ndim == 1 else None
            elif isinstance(current, Sequence) and not isinstance(current, (str, bytes)) and len(current):
                vector = current if _is_number(current[0]) else None
            else:
                raise EncoderError(f"hidden state is empty or not a list of numbers ({type(current).__name__})")
            if vector is not None:
                unit = self._check(vector)
                if step is not None:
                    self.remember(step, unit)
                return unit
            current = current[-1]
        raise EncoderError("hidden state is nested too deeply: expected a vector or a list of per-token vectors")

    def from_choice(self, choice: object) -> np.ndarray:
        """`from_hidden` of a chat-completion choice's `hidden_states` (an `openai` object or a dict)."""
        if isinstance(choice, Mapping):
            values = choice.get("hidden_states")
        else:
            values = getattr(choice, "hidden_states", None)
            if values is None:
                values = (getattr(choice, "model_extra", None) or {}).get("hidden_states")
        if values is None:
            raise EncoderError(
                "the completion carries no hidden_states: start SGLang with --enable-return-hidden-states and send"
                f" extra_body={REQUEST_EXTRA}"
            )
        return self.from_hidden(values)

    def _check(self, vector: Iterable[Any]) -> np.ndarray:
        try:
            array = np.asarray(vector, dtype=np.float32)
        except (TypeError, ValueError):
            raise EncoderError("hidden state vector holds something other than numbers") from None
        if array.ndim != 1:
            raise EncoderError(f"hidden state vector has shape {array.shape}, expected ({self.dim},)")
        if array.shape[0] != self.dim:
            raise EncoderError(
                f"hidden state has {array.shape[0]} dims, expected {self.dim} for model '{self.model}'"
                " — set leash.dim to the weak model's hidden size"
            )
        if not np.isfinite(array).all():
            raise EncoderError("hidden state contains NaN or infinity")
        unit: np.ndarray = normalise_rows(array)[0]
        return unit
