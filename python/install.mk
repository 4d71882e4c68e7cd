# The Python package (python/refit, pure Python over librefit.so), installed
# by `make install` into Debian's Python: /usr/lib/python3/dist-packages for
# PREFIX=/usr, else PREFIX/lib/python3.X/dist-packages (on /usr/bin/python3's
# path for /usr/local).  PYTHON_SITE overrides.  refit/_libdir.py is
# rewritten to name PREFIX/lib, where librefit.so.1 is installed.
PYTHON3     ?= /usr/bin/python3
PYTHON_VER  := $(shell $(PYTHON3) -c 'import sys; print("python%d.%d" % sys.version_info[:2])' 2>/dev/null)
PYTHON_SITE ?= $(if $(filter /usr,$(PREFIX)),/usr/lib/python3/dist-packages,$(PREFIX)/lib/$(PYTHON_VER)/dist-packages)

.PHONY: install-python
install: install-python
install-python: install-librefit
	install -d $(DESTDIR)$(PYTHON_SITE)/refit
	install -m 0644 $(filter-out python/refit/_libdir.py,$(wildcard python/refit/*.py)) \
		$(DESTDIR)$(PYTHON_SITE)/refit/
	printf '"""Where make install put librefit.so."""\nLIBDIR = "%s"\n' "$(PREFIX)/lib" \
		>$(DESTDIR)$(PYTHON_SITE)/refit/_libdir.py
	install -d $(DESTDIR)$(PREFIX)/share/refit/examples/python
	install -m 0755 python/examples/*.py $(DESTDIR)$(PREFIX)/share/refit/examples/python/
