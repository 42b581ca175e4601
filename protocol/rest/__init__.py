"""The HTTP/REST wire form of requests, responses and the extensions' bodies."""
