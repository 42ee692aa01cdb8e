"""The pure engine: no I/O, no client library, no settings loading.

Durations, the layout of tiers, delay plans, routing keys, the topology as data, message
headers, the sans-IO publishing core, retry decisions, parking headers and handler
decoding. Everything here is testable without a broker; ``tests/unit`` does.
"""
