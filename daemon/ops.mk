# Operations (docs/operations.md), included by the top-level Makefile:
# the grpc.health.v1 messages generated from proto/grpc/health/v1/health.proto
# (compiled inside daemon/health.c, their only user); libmicrohttpd serves
# /metrics (daemon/metrics.c) and is linked with the RPC libraries.
HEALTH_C := $(GEN)/grpc/health/v1/health.pb-c.c

$(HEALTH_C): proto/grpc/health/v1/health.proto
	@mkdir -p $(GEN)
	@$(if $(Q),echo "  PROTOC  $<")
	$(Q)protoc-c --c_out=$(GEN) -Iproto $<

$(BUILD)/obj/daemon/health.o $(ASAN)/obj/daemon/health.o: $(HEALTH_C)
