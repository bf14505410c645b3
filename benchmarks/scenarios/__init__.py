"""The scenarios, in the order `all` runs them. Each is `async run(Options) -> dict`."""

from benchmarks.scenarios import (
    beyond,
    churn,
    connect,
    delta_bytes,
    eds,
    envoyfilter,
    gateway_api,
    memory,
    push,
    recording,
    scaleout,
    sniffing,
)

SCENARIOS = {"push": push.run, "eds": eds.run, "churn": churn.run, "connect": connect.run,
             "memory": memory.run, "recording": recording.run, "gateway_api": gateway_api.run,
             "envoyfilter": envoyfilter.run, "delta_bytes": delta_bytes.run,
             "scaleout": scaleout.run, "beyond": beyond.run, "sniffing": sniffing.run}
# Run only when named: `sniffing` is six `push` runs, a comparison for a closing note.
ON_DEMAND = ("sniffing",)
