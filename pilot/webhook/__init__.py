"""The validating admission webhook on --httpsAddr (15017): the review logic (admission.py),
its TLS server (server.py) and the leader-only writer of the webhook configuration's caBundle
(ca_bundle.py)."""
