# The etcd client (rpc/etcd.c, docs/ha.md), included by the top-level
# Makefile: the subset of etcd's v3 API in proto/etcd/, generated into
# build/gen and compiled inside rpc/etcd.c (KV, Lease) and rpc/etcd_watch.c
# (Watch), their only users.
ETCD_PB_C := $(GEN)/etcd/kv.pb-c.c $(GEN)/etcd/etcd.pb-c.c $(GEN)/etcd/watch.pb-c.c

$(GEN)/etcd/%.pb-c.c: proto/etcd/%.proto
	@mkdir -p $(GEN)
	@$(if $(Q),echo "  PROTOC  $<")
	$(Q)protoc-c --c_out=$(GEN) -Iproto $<
$(GEN)/etcd/%.pb-c.h: $(GEN)/etcd/%.pb-c.c
	@:

$(BUILD)/obj/rpc/etcd.o $(ASAN)/obj/rpc/etcd.o: $(ETCD_PB_C) $(ETCD_PB_C:.c=.h)
$(BUILD)/obj/rpc/etcd_watch.o $(ASAN)/obj/rpc/etcd_watch.o: $(ETCD_PB_C) $(ETCD_PB_C:.c=.h)
