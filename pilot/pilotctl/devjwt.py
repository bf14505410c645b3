"""A local test JWT issuer for file mode, where there is no Kubernetes to issue service-account
tokens: `pilotctl jwt init DIR` makes a key and its JWKS, `pilotctl jwt rule DIR` prints the
JWT_RULE the control plane trusts it by, `pilotctl jwt token DIR --namespace NS --sa SA` signs a
token naming that workload (the claims a projected Kubernetes token has). For trying things out:
the key sits unencrypted in DIR."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from pilot.pilotctl.client import CtlError

ISSUER = "pilotctl-test-issuer"
AUDIENCE = "istio-ca"  # what the CA's authenticators require by default (TOKEN_AUDIENCES)
KEY_FILE, JWKS_FILE = "key.pem", "jwks.json"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def init(directory: str) -> str:
    d = Path(directory)
    if (d / KEY_FILE).exists():
        return f"{d / KEY_FILE} exists: keeping it"
    d.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    pub = key.public_key().public_numbers()
    jwk = {"kty": "EC", "crv": "P-256", "kid": "pilotctl", "alg": "ES256", "use": "sig",
           "x": _b64(pub.x.to_bytes(32, "big")), "y": _b64(pub.y.to_bytes(32, "big"))}
    path = d / KEY_FILE
    path.touch(mode=0o600)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    (d / JWKS_FILE).write_text(json.dumps({"keys": [jwk]}) + "\n")
    return f"wrote {d / KEY_FILE} and {d / JWKS_FILE}"


def _read(directory: str) -> tuple[ec.EllipticCurvePrivateKey, dict]:
    d = Path(directory)
    try:
        key = serialization.load_pem_private_key((d / KEY_FILE).read_bytes(), None)
        jwks = json.loads((d / JWKS_FILE).read_text())
    except FileNotFoundError as e:
        raise CtlError(f"{e.filename} does not exist: run `pilotctl jwt init {directory}` first") from None
    except (ValueError, TypeError) as e:
        raise CtlError(f"{directory} does not hold a key made by `pilotctl jwt init`: {e}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CtlError(f"{d / KEY_FILE} is not an EC key")
    return key, jwks


def rule(directory: str) -> str:
    """The JWT_RULE value: this issuer, the CA audience, the JWKS inline."""
    _, jwks = _read(directory)
    return json.dumps({"issuer": ISSUER, "audiences": [AUDIENCE], "jwks": json.dumps(jwks)})


def token(directory: str, namespace: str, service_account: str, lifetime_s: float = 3600) -> str:
    if not namespace or not service_account:
        raise CtlError("--namespace and --sa must not be empty")
    key, jwks = _read(directory)
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": [AUDIENCE], "iat": now, "exp": now + int(lifetime_s),
              "sub": f"system:serviceaccount:{namespace}:{service_account}",
              "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": service_account}}}
    head = {"alg": "ES256", "typ": "JWT", "kid": jwks["keys"][0].get("kid", "")}
    signing_input = f"{_b64(json.dumps(head).encode())}.{_b64(json.dumps(claims).encode())}"
    r, s = decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
    return f"{signing_input}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"
