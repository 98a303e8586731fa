"""The configuration users write, and the serving command's options: servers.yaml (or a client's own
file), `${VAR}` references, providers, where a backend's command is found."""

# Where messages send a user to read more: a page and an anchor that exist (tests/test_first_day.py checks
# every such reference the package makes).
CONFIG_REFERENCE = "docs/CONFIG.md#serversyaml-reference"  # every key of servers.yaml
MODELS_REFERENCE = "docs/CONFIG.md#model-providers-and-actions"  # `models:` and their providers
