"""Importing a user's .py file (a reward function, an environment) as a module, once per file."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


class NotImportable(ValueError):
    """The file is missing, is not Python, or raised while it was imported; the message says which."""


def import_file(path: Path, prefix: str) -> ModuleType:
    """The module of the .py file at `path`, imported once per absolute path (a second call reuses it)
    under the name PREFIX_<hash>, registered in sys.modules (dataclasses and pickling look modules up by
    name). A file whose import raises is not kept."""
    path = path.expanduser()
    if not path.is_file():
        raise NotImportable(f"{path} does not exist (looked at {path.resolve()})")
    resolved = path.resolve()
    mod_name = f"{prefix}_{path.stem}_{hashlib.sha256(str(resolved).encode()).hexdigest()[:12]}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, resolved)
    if spec is None or spec.loader is None:
        raise NotImportable(f"{path} cannot be imported as Python; name a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        sys.modules.pop(mod_name, None)
        raise NotImportable(f"importing {path} failed: {type(e).__name__}: {e}") from e
    return module
