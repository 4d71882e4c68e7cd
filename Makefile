# refit - top-level build.
#
#   make            build everything into build/ (binaries in build/bin/)
#   make check      deps, -Werror build, unit tests, CLI tests, the same
#                   tests under ASan + UBSan, fuzz smoke runs; ends with
#                   the summary line
#   make demo       a real refit end to end on loopback (tcp data plane)
#   make demo-nccl  the same over the nccl transport on the CUDA + NCCL emulator
#   make check-nccl the emulator's rules, the e2e and fault suites over nccl on it
#   make bench      planner, RPC, data-plane and refit benchmarks
#   make testbed    the emulated-topology testbed (root: network namespaces)
#   make figures    regenerate the planner and model figures of README.md and
#                   docs/performance.md (FIGURES=name,... for some of them)
#   make install    PREFIX=/usr/local DESTDIR=
#   make deps       install missing Debian packages (apt-get)
#   V=1             show full commands
#
# CUDA and NCCL are optional: nothing here needs them to build or run.

BUILD   ?= build
PREFIX  ?= /usr/local
DESTDIR ?=
CC      ?= gcc
CUDA_HOME ?= /usr/local/cuda

ifeq ($(V),1)
Q :=
else
Q := @
endif

PKGS        := libcjson
RPC_PKGS    := grpc libprotobuf-c libuv libmicrohttpd
RPC_CFLAGS  := $(shell pkg-config --cflags $(RPC_PKGS) 2>/dev/null)
RPC_LIBS    := $(shell pkg-config --libs $(RPC_PKGS) 2>/dev/null || echo -lgrpc -lgpr -lprotobuf-c -luv -lmicrohttpd)
GEN         := $(BUILD)/gen
PROTO_C     := $(GEN)/refit/v1/refit.pb-c.c
PKG_CFLAGS  := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS    := $(shell pkg-config --libs $(PKGS) 2>/dev/null || echo -lcjson)
CHECK_CFLAGS := $(shell pkg-config --cflags check 2>/dev/null)
CHECK_LIBS  := $(shell pkg-config --libs check 2>/dev/null || echo -lcheck -lsubunit -lrt -lm -lpthread)

# CUDA / NCCL headers are detected, never required.
HAVE_CUDA_H := $(shell test -f $(CUDA_HOME)/include/cuda_runtime_api.h && echo 1)
HAVE_NCCL_H := $(shell test -f $(CUDA_HOME)/include/nccl.h && echo 1)

# the nccl transport is compiled where both headers exist (loaded with dlopen)
ifeq ($(HAVE_CUDA_H)$(HAVE_NCCL_H),11)
GPU_CFLAGS := -DREFIT_HAVE_NCCL -isystem $(CUDA_HOME)/include
endif

# refit's strided-copy kernel: built where nvcc exists, loaded at run time
NVCC        ?= $(CUDA_HOME)/bin/nvcc
HAVE_NVCC   := $(shell test -x $(NVCC) && echo 1)
GPU_KERNELS := $(BUILD)/lib/librefit-gpu-kernels.so
# conversion kernels (docs/conversion.md): built where nvcc exists, loaded at run time
CUDA_CONV   := $(if $(HAVE_NVCC),$(BUILD)/lib/librefit-convert-cuda.so)
NVCC_ARCH   ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
	       -gencode arch=compute_90,code=compute_90

WERROR  ?= -Werror
OPT     ?= -O2
# error messages are bounded on purpose: truncating them is not a bug
CFLAGS_COMMON := -std=gnu11 -D_GNU_SOURCE -Wall -Wextra $(WERROR) -g -MMD -MP \
		 -Wno-format-truncation \
		 -I. $(PKG_CFLAGS) -fno-strict-aliasing
CFLAGS  ?=
CFLAGS  += $(CFLAGS_COMMON) $(OPT) -DREFIT_DATADIR=\"$(PREFIX)/share/refit\"
LDLIBS  := $(PKG_LIBS) -lm -lpthread

SAN_FLAGS := -O1 -fsanitize=address,undefined -fno-sanitize-recover=all \
	     -fno-omit-frame-pointer

# the RPC layer (rpc/) sits below the daemon's roles and the client library
DAEMON_SRC := $(filter-out daemon/main.c,$(wildcard daemon/*.c daemon/coord/*.c daemon/node/*.c \
		daemon/transport/*.c rpc/*.c))
COMMON_SRC := $(wildcard common/*.c)
PLAN_SRC   := $(wildcard plan/*.c)
CODEC_SRC  := $(wildcard codec/*.c)
DP_SRC     := $(wildcard dataplane/*.c)
LIB_SRC    := $(COMMON_SRC) $(PLAN_SRC) $(CODEC_SRC) $(DP_SRC)
UNIT_SRC   := $(wildcard tests/unit/*.c)
# the node's slice executor, run over a scripted transport (test_dataplane.c)
UNIT_DAEMON := daemon/node/slice.c

# $(call objs,variant-dir,sources)
objs = $(patsubst %.c,$(1)/obj/%.o,$(2))

LIB      := $(BUILD)/lib/librefit-core.a
RPCLIB   := $(BUILD)/lib/librefit-rpc.a
BIN      := $(BUILD)/bin/refit-plan
REFITD   := $(BUILD)/bin/refitd
REFITCTL := $(BUILD)/bin/refitctl
UNIT     := $(BUILD)/tests/unit
BENCH    := $(BUILD)/bin/bench-plan
ASAN     := $(BUILD)/asan
ASAN_LIB := $(ASAN)/lib/librefit-core.a
ASAN_BIN := $(ASAN)/bin/refit-plan
ASAN_UNIT := $(ASAN)/tests/unit

.PHONY: all check demo bench install deps clean fuzz config unit asan cli-test testbed \
	check-nccl demo-nccl figures
LIBREFIT := $(BUILD)/lib/librefit.a
REFITCLI := $(BUILD)/bin/refit-client

all: $(BIN) $(UNIT) $(BENCH) $(REFITD) $(REFITCTL) $(BUILD)/bin/bench-rpc \
     $(BUILD)/bin/bench-members \
     $(BUILD)/bin/bench-dataplane $(LIBREFIT) $(REFITCLI) $(BUILD)/tests/gpu-test \
     $(if $(HAVE_NVCC),$(GPU_KERNELS)) \
     $(BUILD)/tests/cvt-tool $(BUILD)/tests/cvt-gpu-test $(CUDA_CONV)

deps:
	$(Q)sh scripts/deps.sh

config:
	@echo "cuda headers: $(if $(HAVE_CUDA_H),yes ($(CUDA_HOME)),no)"
	@echo "nccl headers: $(if $(HAVE_NCCL_H),yes ($(CUDA_HOME)),no)"
	@echo "nccl transport: $(if $(GPU_CFLAGS),compiled in (libraries loaded at run time),not compiled (headers missing))"
	@echo "gpu kernels: $(if $(HAVE_NVCC),$(GPU_KERNELS) (nvcc $(NVCC)),not built (no nvcc: strided boxes go row by row))"

# ---- generated protobuf code (build/gen only) ----------------------------
$(PROTO_C): proto/refit/v1/refit.proto
	@mkdir -p $(GEN)
	@$(if $(Q),echo "  PROTOC  $<")
	$(Q)protoc-c --c_out=$(GEN) -Iproto $<
$(PROTO_C:.c=.h): $(PROTO_C)

# ---- normal build -------------------------------------------------------
$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(call objs,$(BUILD),$(LIB_SRC))
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

$(BUILD)/obj/daemon/%.o: daemon/%.c $(PROTO_C)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) $(RPC_CFLAGS) $(GPU_CFLAGS) -I$(GEN) -c $< -o $@

$(BUILD)/obj/rpc/%.o: rpc/%.c $(PROTO_C)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) $(RPC_CFLAGS) -I$(GEN) -c $< -o $@

$(BUILD)/obj/client/%.o: client/%.c $(PROTO_C)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) $(RPC_CFLAGS) -I$(GEN) -c $< -o $@

# librefit: the client library (librefit.so, librefit.a, refit.pc)
include client/librefit.mk
# the Python package (python/refit): make install
include python/install.mk
# operations: health proto, metrics
include daemon/ops.mk

# GPU tests: compiled in every build (a skip where the headers are missing)
$(BUILD)/obj/tests/gpu/gpu_test.o: tests/gpu/gpu_test.c $(PROTO_C)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) $(GPU_CFLAGS) -I$(GEN) -c $< -o $@

$(BUILD)/tests/gpu-test: $(BUILD)/obj/tests/gpu/gpu_test.o $(RPCLIB) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(RPC_LIBS) $(LDLIBS) -ldl

# the shared CUDA runtime: one runtime (one current device per thread) with refitd's
$(GPU_KERNELS): daemon/transport/kernels.cu daemon/transport/gpu_kernels.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(NVCC) -O2 -shared -Xcompiler -fPIC -cudart shared -I. $(NVCC_ARCH) -o $@ $<
$(BUILD)/lib/librefit-convert-cuda.so: daemon/transport/convert_kernels.cu \
		daemon/transport/convert_kernels.h dataplane/convert_elem.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(NVCC) -std=c++14 -O2 -I. -Xcompiler -fPIC -shared $(NVCC_ARCH) -o $@ $<

$(BUILD)/tests/cvt-gpu-test: $(BUILD)/obj/tests/conversion/cvt_gpu_test.o $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS) -ldl

# the C conversion of one tensor, for the numpy cross-check (tests/conversion)
$(BUILD)/tests/cvt-tool: $(BUILD)/obj/tests/conversion/cvt_tool.o $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(REFITCLI): $(BUILD)/obj/client/refit_client.o $(LIBREFIT) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(RPC_LIBS) $(LDLIBS)

$(BUILD)/obj/gen/refit.pb-c.o: $(PROTO_C)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(filter-out $(WERROR),$(CFLAGS)) $(RPC_CFLAGS) -I$(GEN) -c $< -o $@

$(RPCLIB): $(call objs,$(BUILD),$(DAEMON_SRC)) $(BUILD)/obj/gen/refit.pb-c.o
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

$(REFITD): $(call objs,$(BUILD),daemon/main.c) $(RPCLIB) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(RPC_LIBS) $(LDLIBS)

$(REFITCTL): $(BUILD)/obj/client/refitctl.o $(RPCLIB) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(RPC_LIBS) $(LDLIBS)

BENCH_RPC := $(BUILD)/bin/bench-rpc
BENCH_DP  := $(BUILD)/bin/bench-dataplane
BENCH_MEMBERS := $(BUILD)/bin/bench-members

$(BUILD)/obj/bench/bench_members.o: bench/bench_members.c $(PROTO_C)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) $(RPC_CFLAGS) -I$(GEN) -c $< -o $@

$(BENCH_MEMBERS): $(BUILD)/obj/bench/bench_members.o $(RPCLIB) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(RPC_LIBS) $(LDLIBS)

$(BENCH_DP): $(call objs,$(BUILD),bench/bench_dataplane.c) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/obj/bench/bench_rpc.o: bench/bench_rpc.c $(PROTO_C)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) $(RPC_CFLAGS) -I$(GEN) -c $< -o $@

$(BENCH_RPC): $(BUILD)/obj/bench/bench_rpc.o $(RPCLIB) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(RPC_LIBS) $(LDLIBS)

$(BIN): $(call objs,$(BUILD),client/refit_plan.c) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BENCH): $(call objs,$(BUILD),bench/bench_plan.c) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/obj/tests/unit/%.o: tests/unit/%.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) $(CHECK_CFLAGS) -c $< -o $@

$(UNIT): $(call objs,$(BUILD),$(UNIT_SRC) $(UNIT_DAEMON)) $(LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(CHECK_LIBS) $(LDLIBS)

# ---- ASan + UBSan build -------------------------------------------------
$(ASAN)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC-SAN  $<")
	$(Q)$(CC) $(CFLAGS_COMMON) $(SAN_FLAGS) $(CHECK_CFLAGS) -c $< -o $@

$(ASAN_LIB): $(call objs,$(ASAN),$(LIB_SRC))
	@mkdir -p $(dir $@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(ASAN_BIN): $(call objs,$(ASAN),client/refit_plan.c) $(ASAN_LIB)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(SAN_FLAGS) -o $@ $^ $(LDLIBS)

$(ASAN_UNIT): $(call objs,$(ASAN),$(UNIT_SRC) $(UNIT_DAEMON)) $(ASAN_LIB)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(SAN_FLAGS) -o $@ $^ $(CHECK_LIBS) $(LDLIBS)

$(ASAN)/obj/daemon/%.o: daemon/%.c $(PROTO_C)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC-SAN  $<")
	$(Q)$(CC) $(CFLAGS_COMMON) $(SAN_FLAGS) $(RPC_CFLAGS) $(GPU_CFLAGS) -I$(GEN) -c $< -o $@

$(ASAN)/obj/rpc/%.o: rpc/%.c $(PROTO_C)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC-SAN  $<")
	$(Q)$(CC) $(CFLAGS_COMMON) $(SAN_FLAGS) $(RPC_CFLAGS) -I$(GEN) -c $< -o $@

$(ASAN)/obj/client/%.o: client/%.c $(PROTO_C)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS_COMMON) $(SAN_FLAGS) $(RPC_CFLAGS) -I$(GEN) -c $< -o $@

$(ASAN)/bin/refit-client: $(ASAN)/obj/client/refit_client.o $(ASAN)/obj/client/librefit.o \
			  $(call objs,$(ASAN),$(DAEMON_SRC)) $(ASAN)/obj/gen/refit.pb-c.o $(ASAN_LIB)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(SAN_FLAGS) -o $@ $^ $(RPC_LIBS) $(LDLIBS)

$(ASAN)/obj/gen/refit.pb-c.o: $(PROTO_C)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(filter-out $(WERROR),$(CFLAGS_COMMON)) $(SAN_FLAGS) $(RPC_CFLAGS) -I$(GEN) -c $< -o $@

$(ASAN)/bin/refitd: $(call objs,$(ASAN),daemon/main.c $(DAEMON_SRC)) $(ASAN)/obj/gen/refit.pb-c.o $(ASAN_LIB)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(SAN_FLAGS) -o $@ $^ $(RPC_LIBS) $(LDLIBS)

$(ASAN)/bin/refitctl: $(ASAN)/obj/client/refitctl.o $(call objs,$(ASAN),$(DAEMON_SRC)) $(ASAN)/obj/gen/refit.pb-c.o $(ASAN_LIB)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(SAN_FLAGS) -o $@ $^ $(RPC_LIBS) $(LDLIBS)

$(ASAN)/obj/tests/gpu/gpu_test.o: tests/gpu/gpu_test.c $(PROTO_C)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS_COMMON) $(SAN_FLAGS) $(GPU_CFLAGS) -I$(GEN) -c $< -o $@

$(ASAN)/tests/gpu-test: $(ASAN)/obj/tests/gpu/gpu_test.o $(call objs,$(ASAN),$(DAEMON_SRC)) \
			$(ASAN)/obj/gen/refit.pb-c.o $(ASAN_LIB)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(SAN_FLAGS) -o $@ $^ $(RPC_LIBS) $(LDLIBS) -ldl

asan: $(ASAN_BIN) $(ASAN_UNIT) $(ASAN)/bin/refitd $(ASAN)/bin/refitctl $(ASAN)/bin/refit-client \
      $(ASAN)/tests/gpu-test

# ---- tests --------------------------------------------------------------
check: deps
	$(Q)$(MAKE) --no-print-directory all asan
	$(Q)sh tests/run-check.sh $(BUILD)

# the nccl transport on the CUDA + NCCL emulator (tests/emu): its rule tests, the
# GPU test program, the e2e and fault suites over nccl, normal and ASan
check-nccl: deps
	$(Q)$(MAKE) --no-print-directory all asan
	$(Q)$(MAKE) --no-print-directory emu
	$(Q)sh tests/run-check-nccl.sh $(BUILD)

unit: $(UNIT)
	$(Q)$(UNIT)

cli-test: $(BIN)
	$(Q)sh tests/cli/run.sh $(BIN)

fuzz: deps
	$(Q)sh tests/fuzz/run.sh $(BUILD) $${FUZZ_SECONDS:-60}

# ---- CUDA + NCCL emulator (tests/emu) -----------------------------------
# Two shared libraries with the SONAMEs of the real ones, loaded by refitd
# through its usual dlopen path (REFIT_CUDA_LIBRARY, REFIT_NCCL_LIBRARY,
# REFIT_GPU_KERNELS_LIBRARY), their rule tests and the ABI check against the
# real headers where they exist (tests/emu/README.md).
EMU_DIR      := $(BUILD)/emu
EMU_RT_SRC   := tests/emu/emu_core.c tests/emu/emu_mem.c tests/emu/emu_stream.c \
		tests/emu/emu_copy.c
EMU_NCCL_SRC := tests/emu/emu_nccl.c tests/emu/emu_boot.c tests/emu/emu_p2p.c
EMU_TEST_OBJ := test_emu.o test_cuda.o test_nccl.o
EMU_CUDART   := $(EMU_DIR)/libcudart.so.13
EMU_NCCL     := $(EMU_DIR)/libnccl.so.2
EMU_CFLAGS   := $(CFLAGS_COMMON) $(OPT) -fPIC
EMU_OUT      := $(EMU_CUDART) $(EMU_NCCL) $(EMU_DIR)/test-emu $(EMU_DIR)/abi-dump \
		$(EMU_DIR)/asan/test-emu
ifeq ($(HAVE_CUDA_H)$(HAVE_NCCL_H),11)
EMU_OUT      += $(EMU_DIR)/abi-dump-real $(EMU_DIR)/real-headers.ok
endif

.PHONY: emu
emu: $(EMU_OUT)
check: emu

$(EMU_DIR)/obj/%.o: tests/emu/%.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(EMU_CFLAGS) -c $< -o $@

$(EMU_CUDART): $(patsubst tests/emu/%.c,$(EMU_DIR)/obj/%.o,$(EMU_RT_SRC))
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -shared -Wl,-soname,libcudart.so.13 -Wl,-z,defs -o $@ $^ -lpthread

$(EMU_NCCL): $(patsubst tests/emu/%.c,$(EMU_DIR)/obj/%.o,$(EMU_NCCL_SRC)) $(EMU_CUDART)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -shared -Wl,-soname,libnccl.so.2 -Wl,-z,defs -o $@ $(filter %.o,$^) \
		-L$(EMU_DIR) -l:libcudart.so.13 -Wl,--disable-new-dtags,-rpath,'$$ORIGIN' \
		-lpthread

$(EMU_DIR)/test-emu: $(addprefix $(EMU_DIR)/obj/,$(EMU_TEST_OBJ)) $(EMU_NCCL) $(EMU_CUDART)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -o $@ $(filter %.o,$^) -L$(EMU_DIR) -l:libnccl.so.2 -l:libcudart.so.13 \
		-Wl,-rpath,'$$ORIGIN' -lpthread

# the same under ASan + UBSan (the rule tests run both)
$(EMU_DIR)/asan/obj/%.o: tests/emu/%.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $< (asan)")
	$(Q)$(CC) $(filter-out $(OPT),$(EMU_CFLAGS)) $(SAN_FLAGS) -c $< -o $@

$(EMU_DIR)/asan/libcudart.so.13: $(patsubst tests/emu/%.c,$(EMU_DIR)/asan/obj/%.o,$(EMU_RT_SRC))
	$(Q)$(CC) $(SAN_FLAGS) -shared -Wl,-soname,libcudart.so.13 -o $@ $^ -lpthread

$(EMU_DIR)/asan/libnccl.so.2: $(patsubst tests/emu/%.c,$(EMU_DIR)/asan/obj/%.o,$(EMU_NCCL_SRC)) \
			      $(EMU_DIR)/asan/libcudart.so.13
	$(Q)$(CC) $(SAN_FLAGS) -shared -Wl,-soname,libnccl.so.2 -o $@ $(filter %.o,$^) \
		-L$(EMU_DIR)/asan -l:libcudart.so.13 -Wl,--disable-new-dtags,-rpath,'$$ORIGIN' \
		-lpthread

$(EMU_DIR)/asan/test-emu: $(addprefix $(EMU_DIR)/asan/obj/,$(EMU_TEST_OBJ)) \
			  $(EMU_DIR)/asan/libnccl.so.2
	$(Q)$(CC) $(SAN_FLAGS) -o $@ $(filter %.o,$^) -L$(EMU_DIR)/asan -l:libnccl.so.2 \
		-l:libcudart.so.13 -Wl,-rpath,'$$ORIGIN' -lpthread

$(EMU_DIR)/abi-dump: tests/emu/abi_dump.c tests/emu/cuda_abi.h
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(EMU_CFLAGS) -o $@ $<

$(EMU_DIR)/abi-dump-real: tests/emu/abi_dump.c
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(EMU_CFLAGS) -DEMU_REAL_HEADERS -isystem $(CUDA_HOME)/include -o $@ $<

# the emulator's definitions compiled against the real prototypes
$(EMU_DIR)/real-headers.ok: $(EMU_RT_SRC) $(EMU_NCCL_SRC) tests/emu/cuda_abi.h
	@mkdir -p $(dir $@)
	$(Q)for f in $(EMU_RT_SRC) $(EMU_NCCL_SRC); do \
		$(CC) $(filter-out -MMD -MP,$(EMU_CFLAGS)) -DEMU_REAL_HEADERS \
			-isystem $(CUDA_HOME)/include -fsyntax-only $$f || exit 1; done
	$(Q)touch $@

# ---- demo, bench, install -----------------------------------------------
demo: deps
	$(Q)$(MAKE) --no-print-directory $(BIN) $(REFITD) $(REFITCTL) $(REFITCLI)
	$(Q)sh scripts/demo.sh $(BIN)

# the demo over the nccl transport on the CUDA + NCCL emulator
demo-nccl: deps
	$(Q)$(MAKE) --no-print-directory $(BIN) $(REFITD) $(REFITCTL) $(REFITCLI) emu
	$(Q)DEMO_TRANSPORT=nccl sh scripts/demo.sh $(BIN)

bench: deps
	$(Q)$(MAKE) --no-print-directory $(BENCH) $(BENCH_RPC) $(BENCH_DP) $(BENCH_MEMBERS) \
		$(REFITD) $(REFITCTL) $(REFITCLI)
	$(Q)$(BENCH)
	@echo
	$(Q)$(BENCH_RPC) $(REFITD)
	@echo
	$(Q)$(BENCH_DP)
	@echo
	$(Q)/usr/bin/python3 bench/bench_refit.py $(BUILD)
	@echo
	$(Q)$(BENCH_MEMBERS) $(REFITD)
	@echo
	$(Q)/usr/bin/python3 bench/bench_scale.py $(BUILD)

# every planner/model figure in README.md and docs/performance.md, rewritten
# between their <!-- figures:NAME --> markers
figures: $(BIN) $(BENCH)
	$(Q)/usr/bin/python3 scripts/figures.py $(BUILD) $(if $(FIGURES),--only $(FIGURES))

# the emulated-topology testbed: network namespaces, tc, needs root
testbed:
	$(Q)sh scripts/deps.sh iproute2 gnuplot-nox
	$(Q)$(MAKE) --no-print-directory $(BIN) $(REFITD) $(REFITCTL) $(REFITCLI)
	$(Q)/usr/bin/python3 bench/testbed/testbed.py $(BUILD) $(TESTBED_ARGS)

SYSTEMD_DIR ?= /lib/systemd/system

install: $(BIN) $(REFITD) $(REFITCTL) $(REFITCLI) $(LIBREFIT)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include
	install -m 0755 $(BIN) $(REFITD) $(REFITCTL) $(REFITCLI) $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 $(LIBREFIT) $(DESTDIR)$(PREFIX)/lib/
	install -m 0644 client/refit.h $(DESTDIR)$(PREFIX)/include/
	install -d $(DESTDIR)$(PREFIX)/share/refit/examples $(DESTDIR)$(PREFIX)/share/doc/refit
	install -m 0644 config/examples/*.json $(DESTDIR)$(PREFIX)/share/refit/examples/
	install -m 0644 config/coordinator.json config/node.json $(DESTDIR)$(PREFIX)/share/refit/
	install -d $(DESTDIR)$(PREFIX)/share/refit/models
	install -m 0644 config/models/*.json $(DESTDIR)$(PREFIX)/share/refit/models/
	install -m 0644 README.md docs/*.md $(DESTDIR)$(PREFIX)/share/doc/refit/
	install -d $(DESTDIR)$(SYSTEMD_DIR)
	for u in refit-coordinator refitd; do \
		sed 's|@PREFIX@|$(PREFIX)|g' systemd/$$u.service.in \
			>$(DESTDIR)$(SYSTEMD_DIR)/$$u.service && \
		chmod 0644 $(DESTDIR)$(SYSTEMD_DIR)/$$u.service || exit 1; \
	done

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
