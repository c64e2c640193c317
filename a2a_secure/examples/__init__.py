"""Small deterministic example agents (no network, no model) used by the demo and tests.

Each module has ``build_agent(identity=None) -> A2AAgent``; ``examples/`` at the top of the
repository shows how to host them and how an orchestrator calls them through a registry.
"""
