"""`a2a-secure serve --app py_delegation_app:app`: the §11 test agent accepting delegation
chains (DelegationRules with no reserved goal), for the interoperability tests while the
Python CLI's `--policy` does not read the `delegation` member."""

from a2a_secure.delegation import DelegationRules
from a2a_secure.server.test_agent import register_test_agent


def app(server):  # noqa: ANN001, ANN201 - the callable form of --app
    server.delegation = DelegationRules.build({})
    register_test_agent(server)
