"""The leaderless conditional-endorsement core, after PnyxDB (see docs/LEADERLESS.md)."""
