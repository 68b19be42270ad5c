"""The deterministic simulator: N cores over a simulated network and storage, one seed."""
