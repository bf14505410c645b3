"""The Gateway API conformance runner (`make conformance`): upstream's test cases, translated into
data (tests/data/gateway-api-conformance/cases.yaml), run against real router Envoys."""
