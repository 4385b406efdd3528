"""Whose is this run folder? Marks that only this user's Themis can make.

A run folder someone sent you is data (docs: "A received run folder is data"): its saved
``config.yaml`` may not choose a network address, a path outside the run or a tracking server,
and its labeler tokens are not valid. Your own runs keep working as before because Themis marks
what it writes with an HMAC-SHA256 (RFC 2104, :mod:`hmac`) under a secret key of this user, kept
outside every run folder: a copied folder carries the marks, but nobody without the key can make
a mark that verifies, so a planted ``config.yaml`` or token hash is recognised as not yours.

The key is ``$THEMIS_OWNER_KEY`` (a file path) or ``~/.config/themis/owner.key`` (honouring
``XDG_CONFIG_HOME``), 32 random bytes created with mode 0600 on first use. Deleting it makes
every earlier mark invalid: your runs are then treated as received (resume names the settings
to pass again; labelers get new links).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

KEY_BYTES = 32


def key_path() -> Path:
    """Where this user's owner key is (see the module docstring)."""
    if os.environ.get("THEMIS_OWNER_KEY"):
        return Path(os.environ["THEMIS_OWNER_KEY"]).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "themis" / "owner.key"


def owner_key() -> bytes | None:
    """This user's secret key, created (0600) on first use; ``None`` when it can be neither
    read nor created (a read-only home): then nothing verifies, everything counts as
    received."""
    path = key_path()
    try:
        key = path.read_bytes()
        if len(key) >= KEY_BYTES:
            return key
    except OSError:
        pass
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it meanwhile (or a short file: refused)
        try:
            key = path.read_bytes()
        except OSError:
            return None
        return key if len(key) >= KEY_BYTES else None
    except OSError:
        return None
    key = secrets.token_bytes(KEY_BYTES)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


def owner_mark(*parts: str | bytes) -> str:
    """The mark of ``parts`` (joined unambiguously) under this user's key: ``hmac:<hex>``, or
    ``""`` without a key."""
    key = owner_key()
    if key is None:
        return ""
    digest = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big") + data)
    return "hmac:" + digest.hexdigest()


def is_owned(mark: str | None, *parts: str | bytes) -> bool:
    """Whether ``mark`` was made by :func:`owner_mark` of the same ``parts`` with this user's
    key (compared in constant time). A missing or empty mark is not."""
    if not mark or not isinstance(mark, str):
        return False
    expected = owner_mark(*parts)
    return bool(expected) and hmac.compare_digest(expected, mark)
