"""Ray's token authentication: turned on for the Ray that `radixmesh up --local` starts, and told in
one line when a Ray cluster that `up --address` joins refuses this process's token.

Without it anyone who reaches a Ray port (GCS, raylet, client server, dashboard) runs code as the
user Ray runs as and reads every actor's arguments. With RAY_AUTH_MODE=token every Ray RPC and HTTP
call must carry the token, which lives in $RADIXMESH_HOME/ray-token (0600, made on first use): not
Ray's default ~/.ray/auth_token, which Ray writes with the process umask (0644 by default). Ray's
own processes read the token file named by RAY_AUTH_TOKEN_PATH, inherited from this process.
"""

import os
import secrets
import socket
from pathlib import Path

from ray._private.authentication.authentication_token_setup import (
    AUTH_MODE_ENV_VAR,
    _enable_token_auth,
    ensure_token_if_auth_enabled,
)
from ray._raylet import AuthenticationTokenLoader, GcsClient  # type: ignore[attr-defined]
from ray.exceptions import AuthenticationError

from radixmesh.cluster.launch.secret_file import default_secret_path, read_private, write_private

AUTH_MODE_ENV = AUTH_MODE_ENV_VAR
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"


def ray_token_path() -> Path:
    return default_secret_path().parent / "ray-token"


def require_ray_token() -> Path:
    """Turn token authentication on for the Ray this process starts next; the token file's path.
    ValueError when an existing token file is readable by other users."""
    path = ray_token_path()
    if not path.exists():
        write_private(path, secrets.token_hex(32))  # what `ray get-auth-token --generate` makes
    read_private(path)
    os.environ[TOKEN_PATH_ENV] = str(path)
    # Ray caches the mode and the token in this process (a Ray started earlier here had its own):
    # its own helper sets the mode and re-reads the config, then the token is loaded afresh.
    _enable_token_auth()
    AuthenticationTokenLoader.instance().reset_cache()
    return path


# What Ray says when a GCS refuses the token (InvalidAuthToken, from the server) or when this process
# wants token auth and has none (raised before connecting): ray/_private/authentication/.
_REFUSALS = ("InvalidAuthToken", "Authentication token is missing or incorrect",
             "Token authentication is enabled but")


def token_refusal(error: BaseException, auth_mode: str | None) -> str | None:
    """The one-line cause and fix when `error` (ray.init's, with its chain) is a token refusal; None when
    it is anything else. `auth_mode`: this process's RAY_AUTH_MODE. ray.init wraps the refusal as
    ConnectionError("Failed to connect ...") whose cause's text holds the AuthenticationError."""
    chain: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    if not any(isinstance(e, AuthenticationError) or any(r in str(e) for r in _REFUSALS) for e in chain):
        return None
    if auth_mode != "token":
        why = f"this process has {AUTH_MODE_ENV}={auth_mode or '(unset)'}, so it sent no token"
    elif any("no authentication token was found" in str(e) for e in chain):
        why = "this process has no token (no ~/.ray/auth_token, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH)"
    else:
        why = "this process's token is not the cluster's"
    return (f"requires Ray token authentication and {why}: set {AUTH_MODE_ENV}=token and copy the head's "
            "~/.ray/auth_token to this machine (or set RAY_AUTH_TOKEN to its contents)")


def check_token(address: str, timeout_s: float = 2.0) -> None:
    """Raise AuthenticationError at once when the GCS at `address` (host:port) refuses this process's
    token: ray.init would retry for ~20 s, logging a line a second, before it gave up. Anything else
    (no one listening, "auto", ray://) is left to ray.init, which reports it; the TCP check first
    because GcsClient waits 40 s for a GCS that is not there."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError:
        return
    # Token mode without a token: Ray's own check raises; GcsClient would abort the process (a failed
    # C++ check in Ray 2.60), which ray.init avoids by making this check first.
    ensure_token_if_auth_enabled(create_token_if_missing=False)
    try:
        GcsClient(address=address)  # its first RPC carries the token; a refusal raises here
    except AuthenticationError:
        raise
    except Exception:  # noqa: BLE001 - not a token problem: ray.init says what it is
        return
