"""The configuration users write: `servers.yaml`, or an MCP client's JSON file (`config/clients.py`).

`load_config(path, environ)` is the one way in. It parses YAML or JSON, expands `${VAR}` and
`${VAR:-default}` from the `environ` the CLI hands it (this module never reads the process
environment itself), validates with the pydantic models below and raises one `ConfigError` naming
every mistake, each with the file, the line where it can, the key and what to change (the text's
side of that, parsing and telling, is `config/file.py`). The names are the product's
interface (see DESIGN.md, "The configuration users write"): keep them stable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mcp_spec_proxy.config.backend_auth import OAuthSettings, oauth_settings
from mcp_spec_proxy.config.clients import as_config
from mcp_spec_proxy.config.file import (
    MISSING_FILE_FIX,
    Lines,
    Loc,
    error_at,
    every_problem,
    expand,
    fields_of,
    parse,
    plain_json,
    validation_problems,
)
from mcp_spec_proxy.config.identity import OWN_SERVER, AccessRule, AuthConfig
from mcp_spec_proxy.errors import ConfigError, ConfigProblem
from mcp_spec_proxy.models import ModelConfig

ReviewMode = Literal["strong", "human", "strong_then_human", "deny", "allow", "leash", "console"]
OnReject = Literal["block", "replace", "repair"]
OnError = Literal["deny", "allow"]
TransportKind = Literal["stdio", "http", "sse"]

_SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,40}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolOverride(_Strict):
    """Per-tool rule, keyed by a glob over the backend's own tool name."""

    read_only: bool | None = None
    hold: bool = False
    review: ReviewMode | None = None
    on_reject: OnReject | None = None


class ToolsConfig(_Strict):
    include: list[str] = Field(default_factory=lambda: ["*"])
    exclude: list[str] = Field(default_factory=list)
    overrides: dict[str, ToolOverride] = Field(default_factory=dict)


class RelayConfig(_Strict):
    """Which of a server's requests to the client reach the client of the call that caused them."""

    sampling: bool = True  # it spends the user's model: each one is audited
    elicitation: bool = True
    roots: bool = True

    def kinds(self) -> frozenset[Literal["sampling", "elicitation", "roots"]]:
        wanted: tuple[tuple[Literal["sampling", "elicitation", "roots"], bool], ...] = (
            ("sampling", self.sampling),
            ("elicitation", self.elicitation),
            ("roots", self.roots),
        )
        return frozenset(kind for kind, on in wanted if on)


class ServerConfig(_Strict):
    """One wrapped MCP server: stdio (`command`) or remote (`url`)."""

    # Claude Desktop and other clients write `type`; we accept their spellings.
    type: Literal["stdio", "http", "sse", "streamable-http", "streamableHttp"] | None = None
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    auth: OAuthSettings | None = None  # an OAuth 2.1 login to a URL backend: `oauth`, or the long form (LOGIN.md)
    enabled: bool = True
    disabled: bool = False  # Claude Desktop's spelling of `enabled: false`
    timeout: float = Field(default=60.0, gt=0)
    startup_timeout: float = Field(default=30.0, gt=0)
    # What to tell the user when it fails to connect: what it needs and how to give it (a server that
    # exits at start knows why, but not what the user can change in this config).
    hint: str | None = None
    max_result_bytes: int = Field(default=20_000_000, gt=0)  # larger results are withheld with an error
    # Trusting annotations trusts the backend: a tool it marks `readOnlyHint: true` runs unreviewed.
    trust_annotations: bool = True
    # `false`: its tools and prompts keep their own names, unprefixed (one server behind the proxy,
    # or servers whose names never meet); a name two servers then share is served by neither.
    namespace: bool = True
    # Hold its read tools that declare `openWorldHint: true` like writes; unset: the top-level value.
    hold_open_world: bool | None = None
    # The era the proxy speaks to it. `legacy`: the initialize handshake, whose back-channel the
    # server's own requests to the client need (a server that refuses it is reached in 2026-07-28);
    # `auto`: 2026-07-28 whenever the server offers it. Measured with the conformance suite:
    # `legacy` passes every scenario `auto` does, and more (docs/BENCHMARKS.md, Conformance).
    protocol: Literal["auto", "legacy"] = "legacy"
    # `per_session`: each handshake-era client session of the HTTP front gets a backend session of its own;
    # `shared`: one for every client. Unset: per_session for a URL backend, shared for stdio (BACKENDS.md).
    isolation: Literal["shared", "per_session"] | None = None
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    relay: RelayConfig = Field(default_factory=RelayConfig)

    _auth = field_validator("auth", mode="before")(oauth_settings)

    @model_validator(mode="after")
    def _one_transport(self) -> ServerConfig:
        if self.command is None and self.url is None:
            raise ValueError("needs either `command` (a stdio server) or `url` (a streamable HTTP or SSE server)")
        if self.command is not None and self.url is not None:
            raise ValueError("has both `command` and `url`; keep the one that reaches this server")
        if self.type == "stdio" and self.url is not None:
            raise ValueError("says `type: stdio` but gives a `url`; use `command` for stdio or drop `type`")
        if self.type not in (None, "stdio") and self.command is not None:
            raise ValueError(f"says `type: {self.type}` but gives a `command`; use `url` for a remote server")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} must start with http:// or https://")
        if self.auth is not None and self.url is None:
            raise ValueError("has `auth:` but no `url`: a login is for a remote server; drop `auth` for a stdio one")
        return self

    @property
    def transport(self) -> TransportKind:
        if self.command is not None:
            return "stdio"
        if self.type == "sse" or (self.type is None and (self.url or "").rstrip("/").endswith("/sse")):
            return "sse"
        return "http"

    @property
    def active(self) -> bool:
        return self.enabled and not self.disabled

    @property
    def per_session(self) -> bool:
        return self.isolation == "per_session" or (self.isolation is None and self.url is not None)


class ReviewConfig(_Strict):
    default: ReviewMode = "human"
    on_reject: OnReject = "block"
    on_error: OnError = "deny"
    # A strong verdict still unreadable after its retry: `reject` the held call (earlier reads
    # stand), whatever `on_error` says; `error` treats it as a reviewer failure (`on_error`).
    unreadable: Literal["reject", "error"] = "reject"
    model: str = "strong"  # which entry of `models:` reviews
    policy: str = ""  # rules the reviewer holds every call to, in plain words
    # What `human` does when the client can neither elicit nor take `input_required`; `console`
    # shows the call on the proxy's approval console (refused when no console is served).
    fallback: Literal["deny", "allow", "console"] = "deny"
    intent: bool = True
    timeout: float = Field(default=300.0, gt=0)


class SpeculationConfig(_Strict):
    """The SpecAgent loop's limits (`delegate`, `run`, the gateway)."""

    draft_steps: int = Field(default=8, ge=1, le=64)  # K: steps the weak model drafts per segment
    max_steps: int = Field(default=40, ge=1)
    max_segments: int = Field(default=20, ge=1)
    max_wall_s: float = Field(default=600.0, gt=0)
    answer_graded: bool = False  # verify the final answer too, like a write


class GatewayConfig(_Strict):
    """The OpenAI-compatible gateway (`mcp-spec-proxy gateway`)."""

    backend_tools: bool = True  # offer the backends' tools besides the client's own
    # Client tools whose names match are reads (run at once); all others are held like writes.
    client_read_only: list[str] = Field(
        default_factory=lambda: ["get_*", "read_*", "list_*", "search_*", "find_*", "lookup_*", "fetch_*"]
    )
    # Conversations kept at once (past it the least recently used is let go, its run cancelled),
    # and how long one may sit idle before it is let go.
    max_sessions: int = Field(default=1024, ge=1)
    session_idle_s: float = Field(default=3600.0, gt=0)


class EmbeddingEndpoint(_Strict):
    base_url: str
    model: str
    api_key_env: str | None = None


LabelTrust = Literal["judgements", "operator", "agent_outcomes", "unknown"]


class LeashConfig(_Strict):
    """LEASH: nearest-neighbour escalation against banks of past successes and failures."""

    encoder: Literal["hashing", "embedding", "hidden"] = "hashing"
    dim: int = Field(default=1024, ge=16, le=16384)  # the hashing encoder's dimension (hidden: the model's)
    embedding: EmbeddingEndpoint | None = None  # for encoder: embedding
    bank_dir: str = "~/.local/state/mcp-spec-proxy/banks"
    k: int = Field(default=10, ge=1, le=100)
    min_neighbours: int = Field(default=5, ge=1)  # fewer near labelled neighbours: no opinion
    min_similarity: float = Field(default=0.5, ge=-1, le=1)  # a neighbour further away is no evidence
    route_threshold: float = Field(default=0.5, ge=0, le=1)  # task failure score at or above: strong-led
    escalate_threshold: float = Field(default=0.6, ge=0, le=1)  # drafted step: end the draft, verify now
    observe_threshold: float = Field(default=0.6, ge=0, le=1)  # unreviewed step: review it after all
    # `review: leash` forwards a write without a strong call only at or below this failure score,
    # only for tools that declare `destructiveHint: false`, and only once `bank calibrate --max-false-accept`
    # has recorded a calibration for this encoder; unset (the default) means every write is reviewed.
    accept_threshold: float | None = Field(default=None, ge=0, le=1)
    # Offer `report_outcome` to MCP clients. Off by default: the agent under review must not label its own work.
    client_outcomes: bool = False
    # Whose `success` labels `review: leash` may accept on (docs/SECURITY.md, "Who labels a LEASH bank"):
    # judgements = strong/human/console verdicts on other sessions' calls; operator = `bank import` and
    # outcomes the operator reported; agent_outcomes = a client's `report_outcome`; unknown = rows
    # stored before provenance was. Failures count whoever labelled them: they can only escalate.
    accept_from: list[LabelTrust] = Field(default_factory=lambda: list[LabelTrust](["judgements", "operator"]))
    accept_min_sessions: int = Field(default=3, ge=1)  # independent sessions (or operator rows) among the successes
    same_client_window: float = Field(default=86400, ge=0)  # seconds a client's own labels do not vouch for it
    labels_per_session_hour: int | None = Field(default=60, ge=0)  # more from one session per bank: not stored

    @model_validator(mode="after")
    def _endpoint(self) -> LeashConfig:
        if self.encoder == "embedding" and self.embedding is None:
            raise ValueError("encoder: embedding needs `embedding: {base_url, model}`")
        return self


class PostgresSettings(_Strict):
    """A PostgreSQL database shared by every replica (`pip install 'mcp-spec-proxy[postgres]'`)."""

    dsn_env: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")  # the variable holding the DSN: it carries a password
    pool_size: int = Field(default=10, ge=1, le=200)
    timeout: float = Field(default=5.0, gt=0)  # seconds to reach the database before a write is refused
    # Seconds between a replica's liveness beats and its sweeps of stopped replicas' held calls. A
    # replica with no lock that has not beaten for 3 of these is presumed stopped.
    heartbeat: float = Field(default=5.0, gt=0, le=300)
    # The variable holding the Fernet key(s), newest first, that encrypt remote backends' OAuth tokens in the database.
    token_key_env: str = Field(default="MCP_SPEC_PROXY_TOKEN_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


class PostgresStore(_Strict):
    """`store: {postgres: {dsn_env: VAR}}`: audit, sessions, approvals, fingerprints and banks in Postgres."""

    postgres: PostgresSettings


class TelemetryConfig(_Strict):
    """`telemetry: {file: PATH, otlp: URL}`: decisions as JSON lines, and traces to an OTLP receiver."""

    file: str | None = None  # what `telemetry: PATH` alone sets (and `--telemetry FILE`)
    # An OTLP/HTTP receiver (protobuf): its base (`/v1/traces` is added) or its traces URL.
    otlp: str | None = None

    @field_validator("otlp")
    @classmethod
    def _receiver(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError(
                f"{url!r} is not the http(s) URL of an OTLP/HTTP receiver — give its base, such as"
                " http://collector:4318 (spans go to its /v1/traces), or its full traces URL"
            )
        return url


class CatalogConfig(_Strict):
    """How clients see the tools: every one listed, or a few meta-tools that search the catalog."""

    # list: tools/list holds every tool. search: it holds `search_tools` and `call_tool` (and the
    # proxy's own tools); a client finds tools by words and calls them through the same write gate.
    mode: Literal["list", "search"] = "list"
    results: int = Field(default=5, ge=1, le=50)  # the most hits one search returns
    # How hits are ranked: words (BM25), encoder (LEASH's: hashing, or its embedding endpoint), hybrid
    # (both fused); auto: hybrid with `leash.encoder: embedding`, else words (see tools/search.py).
    rank: Literal["auto", "hybrid", "words", "encoder"] = "auto"


class RuleConfig(_Strict):
    """One of `rules:` (`calls/rules.py`): when its CEL `when` holds, `review`, `deny` or `effect: write` decide."""

    when: str
    name: str | None = Field(default=None, min_length=1, max_length=80)  # what the audit calls it (else its number)
    review: ReviewMode | None = None
    deny: str | None = Field(default=None, min_length=1)
    effect: Literal["write"] | None = None  # a read may be made a write; nothing makes a write a read

    @field_validator("when")
    @classmethod
    def _compiles(cls, when: str) -> str:
        from mcp_spec_proxy.calls.rules import compile_rule  # CEL loads only for a file that has rules

        compile_rule(when)  # its RuleError is a ValueError: a config error at this rule's line
        return when

    @model_validator(mode="after")
    def _decides(self) -> RuleConfig:
        if self.review is not None and self.deny is not None:
            raise ValueError("a rule either chooses a reviewer (`review:`) or refuses (`deny:`) — keep one")
        if self.review is None and self.deny is None and self.effect is None:
            raise ValueError('a rule must say what it decides — add `review: MODE`, `deny: "why"` or `effect: write`')
        return self


MAX_DRAIN_S = 3600.0
"""The longest drain: a replica that may take longer to stop is one an orchestrator kills first."""


class ProxyConfig(_Strict):
    """The whole file."""

    servers: dict[str, ServerConfig] = Field(default_factory=dict)
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    review: ReviewConfig = Field(default_factory=ReviewConfig)
    speculation: SpeculationConfig = Field(default_factory=lambda: SpeculationConfig())
    gateway: GatewayConfig = Field(default_factory=lambda: GatewayConfig())
    leash: LeashConfig | None = None
    auth: AuthConfig | None = None  # who asks at the HTTP front: an OAuth resource server
    catalog: CatalogConfig = Field(default_factory=lambda: CatalogConfig())
    rules: list[RuleConfig] = Field(default_factory=list)  # first match wins (calls/rules.py)
    access: list[AccessRule] = Field(default_factory=list)  # what each principal sees (calls/access.py)
    telemetry: str | TelemetryConfig | None = None  # a path alone is the JSON lines file
    state_dir: str | None = None
    # Where state lives: `files` (the state directory; one process) or one Postgres for many replicas.
    store: Literal["files"] | PostgresStore = "files"
    separator: str = "__"
    max_name_length: int = Field(default=64, ge=16, le=128)
    hold_open_world: bool = False  # every server's open-world reads are held, unless it says otherwise
    # On SIGTERM: seconds the calls in flight (held ones too) have to finish before they are abandoned.
    drain_s: float = Field(default=30.0, ge=0, le=MAX_DRAIN_S, strict=True, allow_inf_nan=False)

    @field_validator("drain_s", mode="before")
    @classmethod
    def _drain_seconds(cls, value: Any) -> Any:
        # Strict: `true` or "30" is a slip, not seconds, and `.inf` would hold the replica's stop for ever.
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not 0 <= value <= MAX_DRAIN_S:  # NaN fails the comparison too
            raise ValueError(
                f"must be a number of seconds from 0 to {MAX_DRAIN_S:g} (e.g. drain_s: 30), not {value!r};"
                " the orchestrator's grace (Kubernetes' terminationGracePeriodSeconds) must be at least drain_s + 10"
            )
        return value

    @field_validator("servers")
    @classmethod
    def _names(cls, servers: dict[str, ServerConfig]) -> dict[str, ServerConfig]:
        for name in servers:
            if not _SERVER_NAME.match(name):
                raise ValueError(
                    f"server name {name!r} may use only letters, digits, '_' and '-' (1-40 characters),"
                    " because it prefixes every tool name"
                )
            if name == OWN_SERVER:  # what `access:` calls the proxy's own tools
                raise ValueError(f"server name {name!r} is the proxy's own (its tools' server in access:); rename it")
        return servers

    @model_validator(mode="after")
    def _separator_not_in_names(self) -> ProxyConfig:
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,4}", self.separator):
            raise ValueError("separator must be 1-4 of letters, digits, '_', '.' or '-'")
        for name in self.servers:
            if self.separator in name:
                raise ValueError(f"server name {name!r} contains the separator {self.separator!r}; rename it")
            # A hashed tool name keeps `<server><sep>` whole, then `.` and a 7-character suffix may
            # follow: cut into, two servers' names could meet (see `tool_names.public_name`).
            room = self.max_name_length - len(self.separator) - 8
            if len(name) > room:
                raise error_at(
                    ("servers", name),
                    f"server name {name!r} is too long for max_name_length {self.max_name_length}: tool names"
                    f" would cut it; rename it to at most {room} characters or raise max_name_length",
                    self.servers,
                )
        return self

    @model_validator(mode="after")
    def _leash_review_needs_a_learned_encoder(self) -> ProxyConfig:
        # `review: leash` lets a write through on its neighbours alone; hashed words make near
        # neighbours of calls that differ in the one argument that matters, so it needs a real encoder.
        if self.leash is None or self.leash.encoder != "hashing":
            return self
        for key, mode in self.review_modes().items():
            if mode == "leash":
                raise error_at(
                    ("leash", "encoder"),
                    f"`{key}: leash` cannot work with `leash.encoder: hashing` (hashed words are no ground to"
                    " forward a write without a model call) — set leash.encoder: embedding (or hidden) and run"
                    " `mcp-spec-proxy bank calibrate`, or use another review mode",
                    self.leash.encoder,
                )
        return self

    def review_modes(self) -> dict[str, ReviewMode]:
        """Every review mode the file sets, by the key that sets it."""
        used: dict[str, ReviewMode] = {"review.default": self.review.default}
        for server_name, server in self.servers.items():
            for pattern, rule in server.tools.overrides.items():
                if rule.review is not None:
                    used[f"servers.{server_name}.tools.overrides.{pattern}.review"] = rule.review
        for number, call_rule in enumerate(self.rules):
            if call_rule.review is not None:
                used[f"rules.{number}.review"] = call_rule.review
        return used

    @property
    def telemetry_file(self) -> str | None:
        """The JSON lines file of decisions, if the file names one."""
        return self.telemetry.file if isinstance(self.telemetry, TelemetryConfig) else self.telemetry

    @property
    def otlp(self) -> str | None:
        """The OTLP receiver traces go to, if the file names one."""
        return self.telemetry.otlp if isinstance(self.telemetry, TelemetryConfig) else None

    def active_servers(self) -> dict[str, ServerConfig]:
        return {name: server for name, server in self.servers.items() if server.active}


# The keys a config may hold: a part of an error's path that is none of them and that the user did
# not write is a union member pydantic names. Unknown keys are matched against the fields of these
# models, in this order (LEASH's short names, `k` and `dim`, would match any key holding the letter).
_KEYS = fields_of(ProxyConfig)
_SUGGESTIONS = tuple(
    dict.fromkeys(
        name
        for model in (
            ProxyConfig,
            TelemetryConfig,  # before ServerConfig: `otlp_url` meant `otlp`, not a server's `url`
            ServerConfig,
            OAuthSettings,
            ReviewConfig,
            ToolsConfig,
            ToolOverride,
            ModelConfig,
            SpeculationConfig,
            GatewayConfig,
            CatalogConfig,
            RelayConfig,
            PostgresSettings,
            AuthConfig,
            RuleConfig,
            AccessRule,
        )
        for name in model.model_fields
    )
)


def load_config(path: Path, environ: Mapping[str, str]) -> ProxyConfig:
    """Read, expand and validate a config file; every failure is a `ConfigError`."""
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(file, "", "file not found", MISSING_FILE_FIX) from None
    except OSError as exc:
        raise ConfigError(file, "", f"cannot read: {exc.strerror}") from None
    return parse_config_text(text, environ, file=file, json_file=path.suffix.lower() == ".json")


def parse_config_text(
    text: str, environ: Mapping[str, str], *, file: str = "<config>", json_file: bool = False
) -> ProxyConfig:
    """Validate config given as text; `load_config` reads a file and comes here."""
    data = parse(file, text, json_file=json_file)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(file, "", "the top level must be a mapping", "start with `servers:`")
    data = as_config(data, ProxyConfig.model_fields)  # a client's own keys (`globalShortcut`, `inputs`) are not ours
    if "mcpServers" in data:
        if "servers" in data:
            raise ConfigError(file, "mcpServers", "both `servers` and `mcpServers` are given", "keep one of them")
        data["servers"] = data.pop("mcpServers")
    lines = Lines(plain_json(text) if json_file else text)
    unexpanded: list[tuple[Loc, ConfigProblem]] = []
    data = expand(file, lines, data, environ, (), unexpanded)
    try:
        config = ProxyConfig.model_validate(data)
    except ValidationError as exc:
        invalid = validation_problems(
            file, lines, data, exc, keys=_KEYS, suggestions=_SUGGESTIONS, unexpanded=unexpanded
        )
    else:
        invalid = []
    if unexpanded or invalid:
        raise ConfigError.of(every_problem(unexpanded, invalid)) from None
    return config
