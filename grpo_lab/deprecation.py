"""Shims for names that moved: the old name keeps working for one minor version and says where the name went.

A module whose names moved ends with a "Deprecated names" block::

    __getattr__ = moved_names(__name__, {"evaluate": "grpo_lab.evaluation:evaluate"})

Accessing ``grpo_lab.train.evaluate`` (or ``from grpo_lab.train import evaluate``) then warns with a
``DeprecationWarning`` naming ``grpo_lab.evaluation.evaluate`` and returns it. The target module is imported only
when the old name is used, so a shim adds no import at load time. CHANGELOG.md lists every shim and when it goes.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

SINCE = "0.2.0"
REMOVED_IN = "0.3.0"


def warn_moved(old: str, new: str, hint: str = "", stacklevel: int = 3) -> None:
    """Warn that ``old`` is deprecated in favour of ``new`` (both dotted names a user can type)."""
    message = f"{old} is deprecated since grpo-lab {SINCE} and goes in {REMOVED_IN}: use {new} instead"
    warnings.warn(message + (f" ({hint})" if hint else "") + ". See CHANGELOG.md.", DeprecationWarning,
                  stacklevel=stacklevel)


def resolve_target(target: str) -> Any:
    """``"package.module:attribute"`` -> the object it names."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def moved_names(module: str, moved: dict[str, str | tuple[str, str]],
                computed: dict[str, tuple[str, str, Callable[[], Any]]] | None = None,
                removed: dict[str, str] | None = None) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` (PEP 562) serving the old names of ``module``.

    ``moved``: old name -> ``"new.module:name"`` (or ``(target, hint)``), the same object under its new name.
    ``computed``: old name -> ``(new name to tell, hint, factory)`` for a value rebuilt from its replacement.
    ``removed``: old name -> what to use instead, for a name with no faithful replacement (an ``AttributeError``
    that says so, rather than a bare one).
    """
    computed = computed or {}
    removed = removed or {}

    def __getattr__(name: str) -> Any:
        if name in moved:
            target, hint = moved[name] if isinstance(moved[name], tuple) else (moved[name], "")
            warn_moved(f"{module}.{name}", target.replace(":", "."), hint)
            return resolve_target(target)
        if name in computed:
            new, hint, factory = computed[name]
            warn_moved(f"{module}.{name}", new, hint)
            return factory()
        if name in removed:
            raise AttributeError(f"{module}.{name} was removed in grpo-lab {SINCE}: {removed[name]} "
                                 f"(CHANGELOG.md says what changed).")
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
