"""Wire formats and transports: the strict msgpack codec (`codec.py`) and, later, TCP/TLS
transport, gossip and cluster-sending."""
