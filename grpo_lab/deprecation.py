"""Shims for names that moved: the old name keeps working for one minor version and says where the name went.

A module whose names moved ends with a "Deprecated names" block::

    __getattr__ = moved_names(__name__, {"evaluate": "grpo_lab.evaluation:evaluate"})

Accessing ``grpo_lab.train.evaluate`` (or ``from grpo_lab.train import evaluate``) then warns with a
:class:`GrpoLabDeprecationWarning` naming ``grpo_lab.evaluation.evaluate`` and returns it. The target module is
imported only when the old name is used, so a shim adds no import at load time. CHANGELOG.md lists every shim.

**Versions.** A shim says since when the old name is deprecated and in which release it goes, both computed
(:func:`shim_versions`): a move not released yet (``since=None``, the default for a new shim) ships in the release
after ``grpo_lab.__version__`` (:func:`next_release`); a shim that shipped names its release (``since="0.2.0"``). It
goes one minor version after that. When a release is cut, its shims get that release's number.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

import grpo_lab


class GrpoLabDeprecationWarning(DeprecationWarning):
    """A grpo_lab name that moved or goes. The tests turn it into an error (pyproject's ``filterwarnings``), so no
    code of the project itself uses an old name."""


def _parts(version: str) -> tuple[int, int]:
    major, minor, *_ = (int(part) for part in version.split("."))
    return major, minor


def next_release(version: str) -> str:
    """The release after ``version``: its next minor version (``0.2.0`` -> ``0.3.0``; ``0.2.1`` -> ``0.3.0``).

    >>> next_release("0.2.0"), next_release("1.4.2")
    ('0.3.0', '1.5.0')
    """
    major, minor = _parts(version)
    return f"{major}.{minor + 1}.0"


def shim_versions(since: str | None = None) -> tuple[str, str]:
    """(since, removed in) of a shim: ``since`` as given, or for a move not released yet the release after the
    current version; it is removed one minor version after ``since``.

    >>> shim_versions("0.2.0")
    ('0.2.0', '0.3.0')
    """
    since = since or next_release(grpo_lab.__version__)
    return since, next_release(since)


def warn_moved(old: str, new: str, hint: str = "", stacklevel: int = 3, since: str | None = None) -> None:
    """Warn that ``old`` is deprecated in favour of ``new`` (both dotted names a user can type)."""
    since, removed_in = shim_versions(since)
    message = f"{old} is deprecated since grpo-lab {since} and goes in {removed_in}: use {new} instead"
    warnings.warn(message + (f" ({hint})" if hint else "") + ". See CHANGELOG.md.", GrpoLabDeprecationWarning,
                  stacklevel=stacklevel)


def resolve_target(target: str) -> Any:
    """``"package.module:attribute"`` -> the object it names."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def moved_names(module: str, moved: dict[str, str | tuple[str, str]],
                computed: dict[str, tuple[str, str, Callable[[], Any]]] | None = None,
                removed: dict[str, str] | None = None, since: str | None = None) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` (PEP 562) serving the old names of ``module``.

    ``moved``: old name -> ``"new.module:name"`` (or ``(target, hint)``), the same object under its new name.
    ``computed``: old name -> ``(new name to tell, hint, factory)`` for a value rebuilt from its replacement.
    ``removed``: old name -> what to use instead, for a name with no faithful replacement (an ``AttributeError``
    that says so, rather than a bare one). ``since``: the release these moves shipped in (:func:`shim_versions`).
    """
    computed = computed or {}
    removed = removed or {}

    def __getattr__(name: str) -> Any:
        if name in moved:
            target, hint = moved[name] if isinstance(moved[name], tuple) else (moved[name], "")
            warn_moved(f"{module}.{name}", target.replace(":", "."), hint, since=since)
            return resolve_target(target)
        if name in computed:
            new, hint, factory = computed[name]
            warn_moved(f"{module}.{name}", new, hint, since=since)
            return factory()
        if name in removed:
            raise AttributeError(f"{module}.{name} was removed in grpo-lab {shim_versions(since)[0]}: "
                                 f"{removed[name]} (CHANGELOG.md says what changed).")
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
