"""The benchmarks: NOT installed with the product, run from the repository root as modules.

`python -m bench.<name>` for the side-by-side measurements (`overhead`, `actions`, `load`,
`review`, `engine`, `leash`; each module's docstring says what it measures), and
`python -m bench.tau2_retail.runner` for tau2-bench retail (`tau2_retail/`: the retail MCP server,
its data, scripted agents, the user simulator and the report). `cost_model` turns token counts
into MODELLED wall time and HBM traffic; `measure` holds what the scripts share (percentiles, the
machine line), `backends` where the real npm MCP servers are, `accepting` the scripted reviewer
that accepts every write. A benchmark past one module is a package (`engine/`, `load/`) whose
`__main__` is the command. The scripted model server they use is the product's own test double,
`mcp_spec_proxy.testing`. Nothing in `mcp_spec_proxy` imports this package.
"""
