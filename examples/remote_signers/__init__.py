"""Worked adapters for agent keys held by a signing service (a2a_secure/identity/remote.py).

:mod:`.aws_kms` (AWS KMS), :mod:`.gcp_kms` (Google Cloud KMS), :mod:`.vault_transit` (Vault's
transit engine), on the shared helpers of :mod:`.common`. Each imports its cloud library only
when it makes its own client, so this package imports without any of them. README.md beside
this file says how to use them, and what each service's key gives and does not give.
"""
