"""Internals: FFI registration, the reduce kernel wrapper, the XLA executor, JAX compat."""
