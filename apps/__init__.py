"""Applications and the replica layer: the `StateMachine` API, the checkpoint-and-replay
engine that applies committed entries exactly once, and the example apps (the KV store; the
blockchain in `chain`)."""
