"""The configuration users write, and the serving command's options: servers.yaml (or a client's own
file), `${VAR}` references, providers, where a backend's command is found."""
