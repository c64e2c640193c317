"""``python -m a2a_secure``: the ``a2a-secure`` command."""

from a2a_secure.cli import main

raise SystemExit(main())
