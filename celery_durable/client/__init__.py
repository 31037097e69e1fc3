"""The client side: what starts, reads, steers and resumes runs from outside a
worker (``client.Client``, ``async_client.AsyncClient``; both exported by the
package). The web view and the CLI build on it and the public API only."""
