"""The reviewer set a config uses: one reviewer per review mode, and the repair turn.

A mode the config names but cannot build (no model for `strong`, no `leash:` section for
`leash`) is a `ConfigError` pointing at the key that names it. `console` is always built: its
queue is what the approval console front serves (`console_queue`), and without that front it
refuses every call it is given, with a line saying why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mcp_spec_proxy.config import CONFIG_REFERENCE
from mcp_spec_proxy.config.schema import ProxyConfig, ReviewMode
from mcp_spec_proxy.errors import ConfigError
from mcp_spec_proxy.models import ChatModel
from mcp_spec_proxy.review import Reviewer
from mcp_spec_proxy.review.console import ConsoleQueue, ConsoleReviewer
from mcp_spec_proxy.review.policy import AllowReviewer, DenyReviewer, HumanReviewer
from mcp_spec_proxy.review.strong import EscalatingReviewer, Repairer, StrongReviewer
from mcp_spec_proxy.tools.catalog import Catalog

if TYPE_CHECKING:  # LEASH (numpy, FAISS) loads only where a `leash:` section opens it
    from mcp_spec_proxy.leash.layers import Leash


def build_reviewers(
    config: ProxyConfig,
    catalog: Catalog,
    models: dict[str, ChatModel],
    source: str = "config",
    leash: Leash | None = None,
) -> tuple[dict[ReviewMode, Reviewer], Repairer | None]:
    """A reviewer for every mode the config uses; a mode that cannot be built is a `ConfigError`."""
    deny = DenyReviewer()
    refused = DenyReviewer(
        "review.fallback is deny — use a client that can ask you, or set review.fallback: console (the proxy's"
        " approval page) or allow"
    )
    console = ConsoleReviewer(ConsoleQueue(config.review.timeout), leash)
    fallbacks: dict[str, Reviewer] = {"allow": AllowReviewer(), "console": console, "deny": refused}
    fallback = fallbacks[config.review.fallback]
    human = HumanReviewer(fallback)
    reviewers: dict[ReviewMode, Reviewer] = {"allow": AllowReviewer(), "deny": deny, "human": human}
    reviewers["console"] = console
    repairer = None
    model = models.get(config.review.model)
    if model is not None:
        strong = StrongReviewer(model, catalog, config.review.policy, unreadable=config.review.unreadable)
        reviewers["strong"] = strong
        reviewers["strong_then_human"] = EscalatingReviewer(strong, human)
        repairer = Repairer(model, catalog, config.review.policy)
    if leash is not None:
        from mcp_spec_proxy.review.leash import LeashReviewer  # with LEASH itself, never without

        untrusted = {name for name, server in config.servers.items() if not server.trust_annotations}
        reviewers["leash"] = LeashReviewer(leash, reviewers.get("strong", human), untrusted_servers=untrusted)
    for key, mode in config.review_modes().items():
        if mode in reviewers:
            continue
        if mode == "leash":
            raise ConfigError(
                source, key, "review mode 'leash' needs LEASH", f"add a `leash:` section ({CONFIG_REFERENCE})"
            )
        if mode in ("strong", "strong_then_human"):
            raise ConfigError(
                source,
                key,
                f"review mode {mode!r} needs the model `models.{config.review.model}`",
                f"add models: {{{config.review.model}: {{base_url: ..., model: ...}}}} or use human, deny or allow",
            )
        raise ConfigError(
            source,
            key,
            f"review mode {mode!r} is not available in this version",
            "use strong, human, console, deny or allow",
        )
    return reviewers, repairer


def console_queue(reviewers: dict[ReviewMode, Reviewer]) -> ConsoleQueue | None:
    """The approval console's queue among `reviewers` (None for a set built elsewhere)."""
    console = reviewers.get("console")
    return console.queue if isinstance(console, ConsoleReviewer) else None
