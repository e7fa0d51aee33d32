"""HTTP layer (Litestar + msgspec): routes/, wire/ (OpenAPI), http/ (plumbing); it talks to the engines through
`basal.core.engine.front.EnginesFront` only."""
