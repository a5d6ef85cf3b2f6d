"""What the daemon is told: the config schema, the table of platforms, agent profiles, the secrets it
holds, durations in words, the private data directory. The bottom layer: imports no other part."""
