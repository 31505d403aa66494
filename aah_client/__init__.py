"""A small typed HTTP client for the AAH Studio API (docs/api.md). No torch, no aah_core."""

from aah_client.client import ApiClient, ApiError, Plan, ServerBusy, ServiceUnavailable, retry_when_busy

__all__ = ["ApiClient", "ApiError", "Plan", "ServerBusy", "ServiceUnavailable", "retry_when_busy"]
