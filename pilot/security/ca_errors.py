"""The CA's errors: every refusal is a `CAError` whose ``code`` names the gRPC status to answer
with and whose message can be sent to the client as is."""

from __future__ import annotations


class CAError(Exception):
    """A refusal or failure of the CA. ``code`` is the gRPC status code name to answer with."""

    code = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequestError(CAError):
    code = "INVALID_ARGUMENT"


class CSRError(InvalidRequestError):
    """The CSR is oversized, not PEM PKCS#10, badly signed or has an unacceptable key."""


class TTLError(InvalidRequestError):
    """The requested lifetime is above the maximum."""


class IdentityError(InvalidRequestError):
    """An identity to put in the certificate is not a valid SPIFFE ID."""


class CABundleError(CAError):
    """The CA's own material (plugged-in files or stored root) is unusable."""


class CAStorageError(CAError):
    """The root's storage could not be read or written."""

    code = "UNAVAILABLE"
