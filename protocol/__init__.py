"""Wire types, data types, error table and codecs shared by every frontend.

Nothing in this package imports FastAPI or grpc: the frontends depend on it, never the reverse.
"""
