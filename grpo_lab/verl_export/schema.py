"""verl's own schema: find verl's config files (no import of verl) and check every override key against them."""

from __future__ import annotations

import importlib.util
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from grpo_lab.errors import MissingFileError
from grpo_lab.verl_export.overrides import override_args

VERL_SOURCE_ENV = "GRPO_LAB_VERL_SOURCE"


@dataclass(frozen=True)
class VerlConfigSource:
    """verl's trainer config folder (``verl/trainer/config``), its version and where it was found."""

    config_dir: Path
    version: str
    origin: str


@dataclass
class SchemaCheck:
    """Whether verl's config accepts the overrides: ``ok`` None means skipped (``skipped`` says why)."""

    ok: bool | None
    skipped: str = ""
    verl_version: str = ""
    origin: str = ""
    methods: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if self.ok is None:
            return f"its keys were NOT checked against verl's schema ({self.skipped})"
        verdict = "accepted" if self.ok else f"REJECTED ({'; '.join(self.problems)})"
        return f"verl {self.verl_version}'s config schema ({', '.join(self.methods)}) {verdict} every override"


def find_verl_config(source: str | Path | None = None) -> VerlConfigSource | None:
    """verl's config folder from ``source`` (a wheel, checkout, package or config folder), else from
    ``$GRPO_LAB_VERL_SOURCE``, else from an installed ``verl`` (found without importing it); None if nowhere."""
    source = source or os.environ.get(VERL_SOURCE_ENV)
    if source:
        path = Path(source).expanduser()
        if path.is_file() and path.suffix == ".whl":
            path = _unpacked_wheel(str(path.resolve()))
        for package in (path, path / "verl", path.parent.parent):
            if (package / "trainer" / "config" / "ppo_trainer.yaml").is_file():
                return VerlConfigSource(package / "trainer" / "config", _verl_version(package), str(source))
        raise MissingFileError(f"{source} holds no verl config (verl/trainer/config/ppo_trainer.yaml); point "
                               f"{VERL_SOURCE_ENV} at a verl wheel (pip download verl --no-deps), a verl checkout "
                               "or an installed verl package folder.")
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:  # None: absent, or a folder named verl (a namespace), not the package
        return None
    package = Path(list(spec.submodule_search_locations)[0])
    if (package / "trainer" / "config" / "ppo_trainer.yaml").is_file():
        return VerlConfigSource(package / "trainer" / "config", _verl_version(package), f"installed verl at {package}")
    return None


@lru_cache(maxsize=None)
def _unpacked_wheel(wheel: str) -> Path:
    """The config files and version of a verl wheel, unpacked once per process into a temporary folder."""
    target = Path(tempfile.mkdtemp(prefix="grpo_lab_verl_"))
    with zipfile.ZipFile(wheel) as archive:
        members = [n for n in archive.namelist() if n.startswith("verl/trainer/config/") or n == "verl/version/version"]
        archive.extractall(target, members)
    return target / "verl"


def _verl_version(package: Path) -> str:
    version_file = package / "version" / "version"
    return version_file.read_text(encoding="utf-8").strip() if version_file.is_file() else "unknown"


def validate_overrides(overrides: dict[str, Any], source: str | Path | None = None, deep: bool = False) -> SchemaCheck:
    """Check every override key against verl's own config where its files can be found (else a skipped
    :class:`SchemaCheck`): each key in verl's composed ``_generated_ppo_trainer.yaml``; with ``hydra-core``, Hydra's
    composition of ``ppo_trainer`` in struct mode, as ``main_ppo`` starts; with ``deep=True`` and verl importable, its
    ``validate_config``.
    """
    found = find_verl_config(source)
    if found is None:
        return SchemaCheck(ok=None, skipped=f"verl's config files not found: install verl or set {VERL_SOURCE_ENV} "
                                             "to a verl wheel (pip download verl --no-deps) or checkout")
    check = SchemaCheck(ok=True, verl_version=found.version, origin=found.origin)
    generated = found.config_dir / "_generated_ppo_trainer.yaml"
    if generated.is_file():
        import yaml

        defaults = yaml.safe_load(generated.read_text(encoding="utf-8"))
        check.methods.append("keys of _generated_ppo_trainer.yaml")
        check.problems += [f"{key} is not a verl config key" for key in overrides if not _has_key(defaults, key)]
    if importlib.util.find_spec("hydra") is not None:
        check.methods.append("Hydra compose of ppo_trainer (struct mode)")
        composed = _compose(found.config_dir, override_args(overrides), check)
        if composed is not None and deep and found.origin.startswith("installed"):
            _verl_validate_config(composed, check)
        elif deep:
            check.methods.append("verl validate_config skipped (needs hydra and the config of an importable verl)")
    if not check.methods:
        return SchemaCheck(ok=None, skipped=f"no _generated_ppo_trainer.yaml in {found.config_dir} and hydra-core is "
                                            "not installed", verl_version=found.version, origin=found.origin)
    check.ok = not check.problems
    return check


def _has_key(tree: Any, dotted: str) -> bool:
    for part in dotted.lstrip("+").split("."):
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def _compose(config_dir: Path, args: list[str], check: SchemaCheck):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    try:
        with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base=None):
            config = compose(config_name="ppo_trainer", overrides=args)
        OmegaConf.to_container(config, resolve=True)
    except Exception as error:  # noqa: BLE001 - Hydra raises several types; each is a rejection to report
        check.problems.append(f"Hydra: {str(error).splitlines()[0]}")
        return None
    return config


def _verl_validate_config(config: Any, check: SchemaCheck) -> None:
    try:
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import validate_config
    except Exception as error:  # noqa: BLE001 - a partial verl install fails in many ways; report, don't crash
        check.methods.append(f"verl validate_config skipped (import failed: {type(error).__name__}: {error})")
        return
    check.methods.append("verl.utils.config.validate_config")
    try:
        validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    except Exception as error:  # noqa: BLE001
        check.problems.append(f"validate_config: {type(error).__name__}: {error}")
