"""The blockchain example app: signed transactions (`tx`), a sparse Merkle state commitment
(`smt`), accounts with a minted token (`state`, `machine`), blocks (`block`), block
certificates (`certificate`), chain validation (`validate`) and light-client verification
(`light`). See docs/CHAIN.md."""
