"""The engine every worker runs: build, apply strategies, loop."""
