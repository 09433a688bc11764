"""Offline retrieval datastore: corpus readers, tokenisation, Numba counting kernels,
Arrow files plus a datrie suffix index, a checksummed manifest, and the reader.

Entry points: ``datastore.builder.build`` / ``merge``, ``datastore.store.open_datastore``,
``datastore.commands.register`` (CLI). Importing this package loads nothing heavy.
"""
