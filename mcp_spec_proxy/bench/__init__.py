"""Tooling for tests and benchmarks: stand-ins for the things this machine cannot reach.

`scripted_model` is an OpenAI-compatible HTTP server whose replies come from a script, used in
place of a real LLM wherever the product's model client must be exercised over the wire.
"""
