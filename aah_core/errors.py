"""Engine errors. Each message names the value, the rule and the fix."""


class AAHError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidWindowPlan(AAHError, ValueError):
    """A window, a per-head window list or a [n_layer, n_head] plan breaks the window rules."""


class InvalidConfig(AAHError, ValueError):
    """A model, data, training or controller setting is unknown or impossible."""


class BackendUnavailable(AAHError, RuntimeError):
    """An attention backend cannot run here (no CUDA, missing package, backward on CPU, ...)."""


class CheckpointError(AAHError, ValueError):
    """A checkpoint directory is missing, corrupt, foreign or not safetensors + JSON."""


class ExportRefused(AAHError, ValueError):
    """A model's config cannot express a rounded plan (or the grain has no such folder); the message says why."""
