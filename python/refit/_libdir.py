"""Where `make install` put librefit.so (rewritten by it); None in the tree."""
LIBDIR = None
