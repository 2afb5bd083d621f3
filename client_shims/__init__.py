"""What makes a client use the proxy and trust its CA (filled in by the client-shims work)."""
