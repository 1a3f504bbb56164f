"""How a metadata RPC carries the cluster token (gRPC metadata `authorization: Bearer <token>`)."""


TOKEN_METADATA_KEY = "authorization"


def bearer(token: str) -> str:
    """The metadata value carrying `token`."""
    return f"Bearer {token}"
