"""CURVE for the agents' KV-events sockets over tcp: key pairs from the cluster secret, and the one
client key the sockets accept (issue 38: over tcp any process that reached the port read every
prompt's block hashes and, with token ids on, the prompts).

Both key pairs derive from the secret (KeyPurpose.KV_EVENTS_SERVER / _CLIENT: a Curve25519 secret
key is any 32 bytes), so whoever holds the secret can subscribe and nobody else can: the sockets
encrypt every frame, and a ZAP handler on the publisher's own context admits only the client key.
An indexer that is not radixmesh gets the keys from `radixmesh kv-events-keys` (which reads the secret
as `admin-key` does) and sets them on its SUB and DEALER sockets (`connect_curve` shows how).
"""

from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio
import zmq.auth.asyncio
from zmq.utils import z85

from radixmesh.common.secret import ClusterSecret, KeyPurpose

ZAP_DOMAIN = "radixmesh-kv-events"


@dataclass(frozen=True, slots=True)
class CurveKeyPair:
    """A CURVE key pair, both keys z85-encoded (40 characters) as libzmq takes them."""

    public: bytes
    secret: bytes = field(repr=False)


def key_pair(secret: ClusterSecret, purpose: KeyPurpose) -> CurveKeyPair:
    """The key pair `purpose` (KV_EVENTS_SERVER or KV_EVENTS_CLIENT) of the cluster `secret`."""
    if purpose not in (KeyPurpose.KV_EVENTS_SERVER, KeyPurpose.KV_EVENTS_CLIENT):
        raise ValueError(f"{purpose.name} is not a KV-events key")
    private = z85.encode(secret.key(purpose))
    return CurveKeyPair(zmq.curve_public(private), private)


def serve_curve(sock: zmq.Socket[Any], secret: ClusterSecret) -> None:
    """Make `sock` (before it binds) a CURVE server with the secret's server key pair, its clients
    checked by the ZAP handler of its context (`ClientKeyCheck`)."""
    server = key_pair(secret, KeyPurpose.KV_EVENTS_SERVER)
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, server.secret)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, server.public)
    sock.setsockopt_string(zmq.ZAP_DOMAIN, ZAP_DOMAIN)


def connect_curve(sock: zmq.Socket[Any], secret: ClusterSecret) -> None:
    """Make `sock` (before it connects) a CURVE client of a publisher of the same secret."""
    client = key_pair(secret, KeyPurpose.KV_EVENTS_CLIENT)
    sock.setsockopt(zmq.CURVE_SERVERKEY, key_pair(secret, KeyPurpose.KV_EVENTS_SERVER).public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, client.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, client.secret)


class ClientKeyCheck:
    """The ZAP handler of one context: admits a CURVE client only with the secret's client key, and
    counts the others. Use: `start()` before the context's sockets bind, `stop()` after they close."""

    def __init__(self, context: zmq.asyncio.Context, secret: ClusterSecret) -> None:
        self._allowed = key_pair(secret, KeyPurpose.KV_EVENTS_CLIENT).public
        self._auth = zmq.auth.asyncio.AsyncioAuthenticator(context)
        self.refused = 0
        """Subscribers and replay peers refused: their key is not the cluster's."""

    def start(self) -> None:
        self._auth.start()
        self._auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=self)

    def stop(self) -> None:
        self._auth.stop()

    def callback(self, domain: str, client_key: bytes) -> bool:
        """ZAP's question: may this client key connect? (pyzmq's credentials-provider protocol)."""
        allowed = domain == ZAP_DOMAIN and client_key == self._allowed
        self.refused += not allowed
        return allowed
