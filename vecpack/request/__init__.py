"""The typed request a call makes once and every stage reads (see :mod:`vecpack.request.request`)."""
