"""Bearer tokens that expire: an agent that authenticates to the broker as a service client of the
organisation's identity provider (OAuth 2.0 client credentials, RFC 6749 section 4.4) gets a token
from the provider, keeps it, and gets the next one before it expires.

`Broker(token=...)` takes a fixed token or a provider: any callable returning the token (or an
awaitable of it), called before each request; a provider with an `invalidate(token)` method is
told when the broker refused a token, and asked once more. `ClientCredentials` is such a provider.

Fail closed: while the identity provider cannot be reached, the token already held keeps working
until it expires; after that, `TokenUnavailable` says why, and nothing is sent to the broker. The
token request goes only over `https://` (plain `http://` to a loopback host alone, as the broker
fetches its keys): a client secret sent in clear could be read by anyone on the path.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import logging
import os
import ssl
import stat
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

from .errors import TokenUnavailable

log = logging.getLogger("approval_broker")

TokenProvider = Callable[[], "str | Awaitable[str]"]
"""What `Broker(token=...)` takes besides a fixed token: a callable returning the bearer token."""

# A token that says nothing of its lifetime is used this long before the next is asked for.
_DEFAULT_LIFETIME = 300.0
# After a failed renewal, how long the held token is used before the provider is asked again.
_RETRY_AFTER = 2.0
# The largest answer read from the provider.
_MAX_ANSWER = 1024 * 1024


class ClientCredentials:
    """A token provider for an agent registered at the identity provider as a service client.

    `token_url` is the provider's token endpoint; or give `issuer`, and the endpoint is read once
    from `<issuer>/.well-known/openid-configuration`. The client authenticates with `client_id`
    and its secret, from `client_secret_file` (a file only its owner may read, mode 0600 or
    stricter; the secret stays out of command lines and environments) or `client_secret`.
    `scope` (space-separated), `resource` (RFC 8707) and `audience` (the parameter some providers
    use instead) are sent when given. `ca_file` is a PEM CA certificate the provider's HTTPS
    certificate is checked with (a private CA), besides the system's roots.

    A token is fetched at first use, kept, and fetched again once `refresh_at` (0.8) of its
    `expires_in` has passed. If that fetch fails, the token held keeps being used until it
    expires; then `TokenUnavailable`. `requests` counts the token requests made.
    """

    def __init__(
        self,
        token_url: str | None = None,
        *,
        client_id: str,
        client_secret: str | None = None,
        client_secret_file: str | os.PathLike[str] | None = None,
        issuer: str | None = None,
        scope: str | None = None,
        resource: str | None = None,
        audience: str | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        auth_method: str = "basic",
        refresh_at: float = 0.8,
        timeout: float = 10.0,
    ) -> None:
        if (token_url is None) == (issuer is None):
            raise ValueError("give the provider's token_url, or its issuer (to discover the token endpoint), not both")
        if (client_secret is None) == (client_secret_file is None):
            raise ValueError("give client_secret_file (or client_secret), not both")
        if auth_method not in ("basic", "post"):
            raise ValueError("auth_method is 'basic' (HTTP Basic, the default) or 'post' (in the form)")
        if not 0.1 <= refresh_at < 1.0:
            raise ValueError("refresh_at is a fraction of the token's lifetime, between 0.1 and 1")
        if not client_id:
            raise ValueError("client_id is empty")
        self._secret = client_secret if client_secret is not None else read_secret_file(Path(client_secret_file or ""))
        if not self._secret:
            raise ValueError("the client secret is empty")
        for url in (token_url, issuer):
            if url is not None:
                _checked_url(url)
        self._token_url = token_url
        self._issuer = issuer.rstrip("/") if issuer is not None else None
        self.client_id = client_id
        self._form = {k: v for k, v in (("scope", scope), ("resource", resource), ("audience", audience)) if v}
        self._auth_method = auth_method
        self._refresh_at = refresh_at
        self._timeout = timeout
        self._ssl = ssl.create_default_context()
        if ca_file is not None:
            self._ssl.load_verify_locations(cafile=os.fspath(ca_file))
        self._lock = threading.Lock()
        self._token: str | None = None
        self._refresh_after = 0.0
        self._expires = 0.0
        self.requests = 0

    @property
    def where(self) -> str:
        """The provider, for messages."""
        return self._token_url or f"{self._issuer} (discovery)"

    async def __call__(self) -> str:
        """The token to send now: the one held while it is fresh, else a new one."""
        held = self._token
        if held is not None and time.monotonic() < self._refresh_after:
            return held  # no thread needed
        return await asyncio.to_thread(self.token)

    def token(self) -> str:
        """The blocking form of calling the provider."""
        with self._lock:
            now = time.monotonic()
            if self._token is not None and now < self._refresh_after:
                return self._token
            try:
                token, lifetime = self._fetch()
            except TokenUnavailable as e:
                if self._token is not None and time.monotonic() < self._expires:
                    # Asked again in a little while, not before every request.
                    self._refresh_after = min(self._expires, time.monotonic() + _RETRY_AFTER)
                    log.warning(
                        "could not renew the access token (%s); using the one held for %.0f s more, until it expires",
                        e, self._expires - time.monotonic(),
                    )
                    return self._token
                expired = self._token is not None
                self._token = None
                raise TokenUnavailable(
                    f"no access token for {self.client_id!r}: {e}"
                    + (" (and the last token has expired)" if expired else "")
                    + "; nothing was sent to the approval broker, run nothing"
                ) from None
            now = time.monotonic()
            self._token, self._refresh_after, self._expires = token, now + lifetime * self._refresh_at, now + lifetime
            return token

    def invalidate(self, token: str) -> None:
        """The broker refused `token`: the next call fetches a new one."""
        with self._lock:
            if token == self._token:
                self._token = None
                self._refresh_after = self._expires = 0.0

    def _endpoint(self) -> str:
        if self._token_url is None:
            url = f"{self._issuer}/.well-known/openid-configuration"
            document = self._json(urllib.request.Request(url, headers={"accept": "application/json"}), url)
            named = document.get("issuer")
            if not isinstance(named, str) or named.rstrip("/") != self._issuer:
                raise TokenUnavailable(f"the discovery document {url} names another issuer than {self._issuer}")
            endpoint = document.get("token_endpoint")
            if not isinstance(endpoint, str):
                raise TokenUnavailable(f"the discovery document {url} names no token_endpoint")
            _checked_url(endpoint)
            self._token_url = endpoint
        return self._token_url

    def _fetch(self) -> tuple[str, float]:
        url = self._endpoint()
        form = {"grant_type": "client_credentials", **self._form}
        headers = {"accept": "application/json", "content-type": "application/x-www-form-urlencoded"}
        if self._auth_method == "basic":
            # RFC 6749 section 2.3.1: each part form-encoded before the Basic encoding.
            pair = f"{urllib.parse.quote_plus(self.client_id)}:{urllib.parse.quote_plus(self._secret)}"
            headers["authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        else:
            form |= {"client_id": self.client_id, "client_secret": self._secret}
        request = urllib.request.Request(url, data=urllib.parse.urlencode(form).encode(), headers=headers, method="POST")
        self.requests += 1
        answer = self._json(request, url)
        token = answer.get("access_token")
        if not isinstance(token, str) or not token:
            raise TokenUnavailable(f"the identity provider at {url} answered without an access_token")
        expires_in = answer.get("expires_in")
        lifetime = float(expires_in) if isinstance(expires_in, (int, float)) and expires_in > 0 else _DEFAULT_LIFETIME
        return token, lifetime

    def _json(self, request: urllib.request.Request, url: str) -> dict[str, object]:
        try:
            with urllib.request.urlopen(request, timeout=self._timeout, context=self._ssl) as response:
                body = response.read(_MAX_ANSWER)
        except urllib.error.HTTPError as e:
            raise TokenUnavailable(f"the identity provider at {url} refused: {_oauth_error(e)}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise TokenUnavailable(f"the identity provider at {url} could not be reached ({reason})") from None
        try:
            document = json.loads(body)
        except ValueError:
            raise TokenUnavailable(f"the identity provider at {url} answered something that is not JSON") from None
        if not isinstance(document, dict):
            raise TokenUnavailable(f"the identity provider at {url} answered JSON that is not an object")
        return document


def read_secret_file(path: Path) -> str:
    """The secret in `path` (surrounding white space removed), refused when others may read it."""
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"cannot read the client secret file {path}: {e.strerror}") from None
    if os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(
            f"the client secret file {path} may be read by others (mode {stat.S_IMODE(mode):o}); "
            f"make it 0600 (chmod 600 {path})"
        )
    return text.strip()


def _oauth_error(e: urllib.error.HTTPError) -> str:
    """The provider's `error` and `error_description` (RFC 6749 section 5.2), else the status."""
    try:
        body = json.loads(e.read(_MAX_ANSWER))
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            description = body.get("error_description")
            return f"{body['error']} ({description})" if isinstance(description, str) else str(body["error"])
    except (ValueError, OSError):
        pass
    return f"HTTP {e.code}"


def _checked_url(url: str) -> None:
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme == "https" and host:
        return
    if parts.scheme == "http" and _is_loopback(host):
        return
    raise ValueError(
        f"{url!r}: the identity provider is reached over https:// (plain http:// only on a loopback host), "
        "since a client secret sent in clear could be read by anyone on the path"
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
