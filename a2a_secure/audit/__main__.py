"""``python -m a2a_secure.audit FILE [--did DID] [--checkpoint TOKEN]``."""

from a2a_secure.audit.verify import audit_verify_main

raise SystemExit(audit_verify_main())
