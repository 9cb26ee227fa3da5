"""Loads tokenspeed's kv_events.py (the seed shared/seeds/000_*.txt) as a
module, so the tests can run the engine's real ZmqEventPublisher.

A seed file is Python source behind a short header (the upstream path, a
blank line). The source starts at the first line that begins with '#',
'import', 'from' or a docstring quote and from which the rest compiles.
Its imports (msgspec, zmq, pydantic) come from PyPI (requirements.txt).

Where shared/ is: $KVS_SHARED_DIR only (optional: nothing else needs it).
"""

import os
import sys
import types
from pathlib import Path

MODULE_NAME = "tokenspeed_seed_kv_events"
_STARTS = ("#", "import ", "from ", '"""', "'''")


def find_shared_dir() -> Path | None:
    # Only where asked for: the suite needs nothing outside the repository.
    env = os.environ.get("KVS_SHARED_DIR")
    if env:
        p = Path(env)
        return p if (p / "seeds").is_dir() else None
    return None


def find_seed(shared: Path) -> Path | None:
    """The tokenspeed kv_events seed: 000_*.txt when it is that file, else
    whichever seed holds a ZmqEventPublisher."""
    seeds = sorted((shared / "seeds").glob("*.txt"))
    preferred = [p for p in seeds if p.name.startswith("000_")]
    for p in preferred + [p for p in seeds if p not in preferred]:
        text = p.read_text(errors="replace")
        if "class ZmqEventPublisher" in text and "attn_dp_rank" in text:
            return p
    return None


def seed_source(path: Path) -> str:
    """The Python source of a seed file, header skipped. Blank lines stand in
    for the header so line numbers in tracebacks match the file."""
    lines = path.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        if not line.lstrip().startswith(_STARTS):
            continue
        src = "\n" * i + "".join(lines[i:])
        try:
            compile(src, str(path), "exec")
        except SyntaxError:
            continue
        return src
    raise ValueError(f"{path}: no Python source found after the header")


def load_seed(path: Path) -> types.ModuleType:
    """Executes the seed as module MODULE_NAME (registered in sys.modules so
    msgspec and pickling resolve its classes)."""
    if MODULE_NAME in sys.modules:
        mod = sys.modules[MODULE_NAME]
        if getattr(mod, "__file__", None) == str(path):
            return mod
    mod = types.ModuleType(MODULE_NAME)
    mod.__file__ = str(path)
    sys.modules[MODULE_NAME] = mod
    try:
        exec(compile(seed_source(path), str(path), "exec"), mod.__dict__)
    except Exception:
        del sys.modules[MODULE_NAME]
        raise
    return mod
