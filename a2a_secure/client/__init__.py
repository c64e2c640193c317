"""The HTTP client adapter (httpx)."""

from a2a_secure.client.http import A2AClient, RetryPolicy, check_endpoint

__all__ = ["A2AClient", "RetryPolicy", "check_endpoint"]
