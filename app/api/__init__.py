"""HTTP layer: thin FastAPI routes over the service layer; errors as RFC 9457 problems."""
