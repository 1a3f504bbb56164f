"""Ray's token authentication for the Ray that `radixmesh up --local` starts.

Without it anyone who reaches a Ray port (GCS, raylet, client server, dashboard) runs code as the
user Ray runs as and reads every actor's arguments. With RAY_AUTH_MODE=token every Ray RPC and HTTP
call must carry the token, which lives in $RADIXMESH_HOME/ray-token (0600, made on first use): not
Ray's default ~/.ray/auth_token, which Ray writes with the process umask (0644 by default). Ray's
own processes read the token file named by RAY_AUTH_TOKEN_PATH, inherited from this process.
"""

import os
import secrets
from pathlib import Path

from ray._private.authentication.authentication_token_setup import AUTH_MODE_ENV_VAR, _enable_token_auth
from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]

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
