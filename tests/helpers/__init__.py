"""The tests\x27 shared helpers: broker admin, topologies, worker apps, the docs' code blocks."""
