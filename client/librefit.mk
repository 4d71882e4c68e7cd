# librefit: the client library a trainer or an inference server links
# (included by the top-level Makefile).
#
#   $(BUILD)/lib/librefit.so.1   shared, soname librefit.so.1, exporting only
#                                the functions of client/refit.h (librefit.map);
#                                $(BUILD)/lib/librefit.so links to it
#   $(BUILD)/lib/librefit.a      static: one relocatable object whose only
#                                global symbols are those same functions
#   $(BUILD)/lib/pkgconfig/refit.pc
#
# Both hold only what a client needs: client/librefit.c, the RPC client and
# the protobuf conversions it calls, the layout parser and their helpers
# (LIBREFIT_SRC), compiled position-independent under $(BUILD)/pic.  They
# link gRPC, protobuf-c and cJSON (shared; refit.pc names them).

LIBREFIT_MAJOR   := 1
LIBREFIT_VERSION := 1.0.0
LIBREFIT_SO      := $(BUILD)/lib/librefit.so
LIBREFIT_SONAME  := librefit.so.$(LIBREFIT_MAJOR)
LIBREFIT_PC      := $(BUILD)/lib/pkgconfig/refit.pc
LIBREFIT_MAP     := client/librefit.map
LIBREFIT_SRC     := client/librefit.c client/librefit_fw.c rpc/rpc_client.c rpc/rpc_tls.c rpc/rpc_status.c \
		    rpc/proto_conv.c codec/layout_json.c codec/json_util.c \
		    plan/layout.c plan/layout_set.c plan/box.c plan/convert.c \
		    plan/framework.c plan/framework_map.c plan/framework_tensors.c \
		    plan/framework_fsdp2.c plan/model.c \
		    codec/model_json.c codec/framework_json.c \
		    common/alloc.c common/err.c common/status.c common/strbuf.c \
		    common/strmap.c common/utf8.c common/sha256.c
LIBREFIT_OBJ     := $(call objs,$(BUILD)/pic,$(LIBREFIT_SRC)) $(BUILD)/pic/obj/gen/refit.pb-c.o
LIBREFIT_LIBS    := $(shell pkg-config --libs grpc libprotobuf-c libcjson 2>/dev/null || \
		      echo -lgrpc -lgpr -lprotobuf-c -lcjson) -lpthread

all: $(LIBREFIT_SO) $(LIBREFIT_PC)

$(BUILD)/pic/obj/%.o: %.c $(PROTO_C)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC-PIC  $<")
	$(Q)$(CC) $(CFLAGS) -fPIC $(RPC_CFLAGS) -I$(GEN) -c $< -o $@

$(BUILD)/pic/obj/gen/refit.pb-c.o: $(PROTO_C)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC-PIC  $<")
	$(Q)$(CC) $(filter-out $(WERROR),$(CFLAGS)) -fPIC $(RPC_CFLAGS) -I$(GEN) -c $< -o $@

$(BUILD)/lib/$(LIBREFIT_SONAME): $(LIBREFIT_OBJ) $(LIBREFIT_MAP)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -shared -Wl,-soname,$(LIBREFIT_SONAME) -Wl,--version-script,$(LIBREFIT_MAP) \
		-Wl,-z,defs -Wl,--as-needed -o $@ $(LIBREFIT_OBJ) $(LIBREFIT_LIBS)

$(LIBREFIT_SO): $(BUILD)/lib/$(LIBREFIT_SONAME)
	$(Q)ln -sf $(LIBREFIT_SONAME) $@

# the exported names, one a line, from the version script
$(BUILD)/pic/librefit.syms: $(LIBREFIT_MAP)
	@mkdir -p $(dir $@)
	$(Q)sed -n 's/^[[:space:]]*\(refit_[a-z0-9_]*\);$$/\1/p' $< >$@

$(LIBREFIT): $(LIBREFIT_OBJ) $(BUILD)/pic/librefit.syms
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  AR      $@")
	$(Q)ld -r -o $(BUILD)/pic/librefit-all.o $(LIBREFIT_OBJ)
	$(Q)objcopy --keep-global-symbols=$(BUILD)/pic/librefit.syms \
		$(BUILD)/pic/librefit-all.o $(BUILD)/pic/librefit.o
	$(Q)rm -f $@ && ar rcs $@ $(BUILD)/pic/librefit.o

$(LIBREFIT_PC): client/refit.pc.in
	@mkdir -p $(dir $@)
	$(Q)sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(LIBREFIT_VERSION)|g' $< >$@

.PHONY: install-librefit
install: install-librefit
install-librefit: $(LIBREFIT_SO) $(LIBREFIT) $(LIBREFIT_PC)
	install -d $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include
	install -m 0755 $(BUILD)/lib/$(LIBREFIT_SONAME) \
		$(DESTDIR)$(PREFIX)/lib/librefit.so.$(LIBREFIT_VERSION)
	ln -sf librefit.so.$(LIBREFIT_VERSION) $(DESTDIR)$(PREFIX)/lib/$(LIBREFIT_SONAME)
	ln -sf $(LIBREFIT_SONAME) $(DESTDIR)$(PREFIX)/lib/librefit.so
	install -m 0644 $(LIBREFIT) $(DESTDIR)$(PREFIX)/lib/
	install -m 0644 $(LIBREFIT_PC) $(DESTDIR)$(PREFIX)/lib/pkgconfig/
	install -m 0644 client/refit.h $(DESTDIR)$(PREFIX)/include/
