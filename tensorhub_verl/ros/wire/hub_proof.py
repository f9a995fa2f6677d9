"""How a hub proves that it holds the shared token before a client sends it anything secret.

A client opens every connection to the hub with a token-less challenge: ``GET /v1/hello?nonce=N`` where N is a
fresh random nonce of its own. The hub answers with its instance id and, when it has a token, the proof
``HMAC-SHA256(token, LABEL | nonce | instance)``. The client checks the proof (``hmac.compare_digest``) before
the connection carries the bearer token, a job key or a worker credential. A process that took over the hub's
port (the hub died, the port was free) cannot answer: it never saw the token, and a fresh nonce makes every
old answer useless. The label keeps this MAC apart from any other use of the token.

Pure functions: the hub's edge (``hub.app``) and the client's connections (``proven_pool``) share them.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

HELLO_PATH = "/v1/hello"
LABEL = b"tensorhub hub proof v1"
NONCE_BYTES = 16
_NONCE = re.compile(r"[0-9a-f]{32}")
_INSTANCE = re.compile(r"[0-9A-Za-z_-]{1,64}")


def new_nonce() -> str:
    """A fresh client nonce: 16 random bytes, hex."""
    return secrets.token_hex(NONCE_BYTES)


def is_nonce(text: str) -> bool:
    """Whether ``text`` is a nonce as ``new_nonce`` makes them (the hub answers nothing else)."""
    return bool(_NONCE.fullmatch(text))


def is_instance(text: str) -> bool:
    return bool(_INSTANCE.fullmatch(text))


def proof(token: str, nonce: str, instance: str) -> str:
    """The hub's answer to ``nonce``: a MAC of the token over the nonce and the hub's instance id, hex."""
    message = LABEL + b"|" + nonce.encode() + b"|" + instance.encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def proven(token: str, nonce: str, instance: str, presented: object) -> bool:
    """Whether ``presented`` is the proof that only a holder of ``token`` can give for ``nonce``."""
    if not isinstance(presented, str) or not is_instance(instance):
        return False
    return hmac.compare_digest(presented.encode(), proof(token, nonce, instance).encode())
