"""A small typed HTTP client for the AAH Studio API (docs/api.md). No torch, no aah_core."""

from aah_client.client import ApiClient, ApiError, Plan, ServiceUnavailable

__all__ = ["ApiClient", "ApiError", "Plan", "ServiceUnavailable"]
