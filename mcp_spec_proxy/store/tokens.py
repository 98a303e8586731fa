"""One backend's OAuth tokens and client registration, kept in the state directory.

`TokenFile` is the SDK's `TokenStorage` over `<state>/oauth/<server>.json`: the folder is the
owner's alone (0700), the file too (0600, made so before a byte is written), and every write
replaces the file whole (a temporary file beside it, fsynced, then renamed), so a crash leaves the
old tokens or the new, never half of either. The file is bound to the backend's URL: tokens kept
for one URL are never handed out for another (a config whose `url` changed logs in afresh), and a
client registration is kept for the same URL only.

What it keeps is secret: nothing here logs a token, and `describe` says only whether there is one,
when it expires and what scope it carries.

`TokenStore` is the contract both stores keep: this file, and under `store: postgres` a row of the
database shared by every replica (`store/pg_tokens.py`), encrypted. `person_digest` names a
principal's own tokens in both. `hold_refresh` serializes one login's refreshes across processes
where the tokens are shared (`backends/oauth.py`, `RefreshOn401`); a file is one process's, so
its hold is nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import ValidationError

DIR_MODE = 0o700
FILE_MODE = 0o600


@dataclass(frozen=True)
class LoginState:
    """What `check` says of one backend's login: never the token itself."""

    logged_in: bool
    expires_at: float | None = None  # epoch seconds; None: the server gave no expiry
    scope: str | None = None
    refreshable: bool = False

    def describe(self, now: float | None = None) -> str:
        if not self.logged_in:
            return "not logged in"
        parts = ["logged in"]
        if self.expires_at is not None:
            left = self.expires_at - (time.time() if now is None else now)
            parts.append(f"token expires in {_duration(left)}" if left > 0 else "token expired")
        if self.refreshable:
            parts.append("refreshable")
        if self.scope:
            parts.append(f"scope {self.scope!r}")
        return ", ".join(parts)


class RefreshHold(Protocol):
    """One login's refresh, held against the other processes sharing its tokens until `release`."""

    async def release(self) -> None: ...


class TokenStore(Protocol):
    """One backend's (or one principal's) tokens and client registration, bound to the backend's URL:
    the SDK's `TokenStorage`, and what `login`, `logout` and `check` ask of it."""

    @property
    def resource(self) -> str:
        """The backend's URL these tokens were got for."""
        ...

    async def get_tokens(self) -> OAuthToken | None: ...
    async def set_tokens(self, tokens: OAuthToken) -> None: ...
    async def get_client_info(self) -> OAuthClientInformationFull | None: ...
    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None: ...

    def of_principal(self, issuer: str, subject: str) -> TokenStore:
        """The same backend's store for one principal (keyed by `person_digest`)."""
        ...

    async def kept(self) -> tuple[OAuthToken | None, float | None]:
        """The kept tokens and when their access token expires (epoch seconds), in one read."""
        ...

    async def state(self) -> LoginState: ...

    async def principals_logged_in(self) -> int: ...

    async def forget_tokens(self) -> bool:
        """Drop the tokens (the client registration stays, for the next login); True if there were any."""
        ...

    async def hold_refresh(self) -> RefreshHold: ...


def person_digest(issuer: str, subject: str) -> str:
    """A principal's key among a backend's logins: it says nothing of who."""
    return hashlib.sha256(f"{issuer}\n{subject}".encode()).hexdigest()[:32]


def login_state(tokens: OAuthToken | None, expires_at: float | None) -> LoginState:
    if tokens is None or not tokens.access_token:
        return LoginState(False)
    return LoginState(True, expires_at, tokens.scope, bool(tokens.refresh_token))


class _NoHold:
    async def release(self) -> None:
        return None


class TokenFile:
    """The SDK's `TokenStorage` for one backend, in one file (see the module docstring)."""

    def __init__(self, path: Path, resource: str, private: Path | None = None) -> None:
        self.path = path
        self.resource = resource  # the backend's URL: what these tokens were got for
        self.private = private or path.parent  # this folder and every one below it down to the file: 0700

    @classmethod
    def of(cls, state_root: Path, server: str, url: str) -> TokenFile:
        return cls(state_root / "oauth" / f"{server}.json", url)

    def of_principal(self, issuer: str, subject: str) -> TokenFile:
        """One person's tokens for the same backend: `oauth/<server>/<digest of issuer and subject>.json`
        (the file's name says nothing of who; the folders are the owner's alone like this one's)."""
        person = person_digest(issuer, subject)
        return TokenFile(self.path.parent / self.path.stem / f"{person}.json", self.resource, self.private)

    async def get_tokens(self) -> OAuthToken | None:
        data = self._read()
        try:
            return OAuthToken.model_validate(data["tokens"]) if data.get("tokens") else None
        except ValidationError:
            return None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        expires_at = time.time() + tokens.expires_in if tokens.expires_in is not None else None
        await anyio.to_thread.run_sync(
            self._update, {"tokens": tokens.model_dump(mode="json"), "expires_at": expires_at}
        )

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        data = self._read()
        try:
            return OAuthClientInformationFull.model_validate(data["client"]) if data.get("client") else None
        except ValidationError:
            return None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        await anyio.to_thread.run_sync(self._update, {"client": client_info.model_dump(mode="json", exclude_none=True)})

    async def kept(self) -> tuple[OAuthToken | None, float | None]:
        return await self.get_tokens(), self._expires_at(self._read())

    @staticmethod
    def _expires_at(data: dict[str, Any]) -> float | None:
        value = data.get("expires_at")
        return float(value) if isinstance(value, int | float) else None

    async def state(self) -> LoginState:
        return self._state()

    def _state(self) -> LoginState:
        data = self._read()
        tokens = data.get("tokens")
        if not isinstance(tokens, dict) or not tokens.get("access_token"):
            return LoginState(False)
        scope = tokens.get("scope")
        return LoginState(
            True, self._expires_at(data), scope if isinstance(scope, str) else None, bool(tokens.get("refresh_token"))
        )

    async def principals_logged_in(self) -> int:
        """How many principals hold a login of their own for this backend (`of_principal`'s files)."""
        folder = self.path.parent / self.path.stem
        found = folder.glob("*.json") if folder.is_dir() else ()
        return sum(1 for path in found if TokenFile(path, self.resource)._state().logged_in)

    async def forget_tokens(self) -> bool:
        data = self._read()
        if not data.get("tokens"):
            return False
        data.pop("tokens", None)
        data.pop("expires_at", None)
        self._write(data)
        return True

    async def hold_refresh(self) -> RefreshHold:
        return _NoHold()  # one process's file: its provider's own lock serializes its refreshes

    def _read(self) -> dict[str, Any]:
        """The file's record when it is for this URL; else nothing (another URL's tokens are not ours)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("resource") != self.resource:
            return {}
        return data

    def _update(self, changes: dict[str, Any]) -> None:
        self._write({**self._read(), **changes})

    def _write(self, data: dict[str, Any]) -> None:
        folder = self.path.parent
        folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        for level in (folder, *folder.parents):
            os.chmod(level, DIR_MODE)  # an existing folder is made the owner's alone too
            if level == self.private or not level.is_relative_to(self.private):
                break
        record = {**data, "resource": self.resource}
        fd, temporary = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=folder)  # mkstemp makes it 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                json.dump(record, file)
                file.flush()
                os.fsync(file.fileno())
            os.chmod(temporary, FILE_MODE)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "LoginState",
    "RefreshHold",
    "TokenFile",
    "TokenStore",
    "login_state",
    "person_digest",
]
