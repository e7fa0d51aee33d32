"""HTTP layer (Litestar + msgspec): decode, dialect rules, auth, 529 gate; it talks to `core.engine` only."""
