# refit - top-level build.
#
#   make            build everything into build/ (binaries in build/bin/)
#   make check      deps, -Werror build, unit tests, CLI tests, the same
#                   tests under ASan + UBSan, fuzz smoke runs; ends with
#                   the summary line
#   make demo       a real refit end to end on loopback (tcp data plane): a
#                   Megatron-layout trainer -> vLLM-layout instances, in place
#   make demo-nccl  a refit of a 23-tensor model over the nccl transport on the
#                   CUDA + NCCL emulator (scripts/demo.sh)
#   make check-nccl the emulator's rules, the e2e and fault suites over nccl on it
#   make bench      planner, RPC, data-plane, delta codec, refit and memory-soak
#                   benchmarks
#   make bench-soak the memory soak alone (SOAK_REFITS=100,1000)
#   make testbed    the emulated-topology testbed (root: network namespaces)
#   make figures    regenerate the figures of README.md and docs/*.md from the
#                   commands that measure them (FIGURES=name,... for some of
#                   them; FIGURES_SET=slow for the slow ones, all for both)
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
# data_tls (daemon/transport/tcp_tls.c) links libssl, which gRPC loads anyway
RPC_LIBS    += $(shell pkg-config --libs libssl libcrypto 2>/dev/null || echo -lssl -lcrypto)
GEN         := $(BUILD)/gen
PROTO_C     := $(GEN)/refit/v1/refit.pb-c.c
PKG_CFLAGS  := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS    := $(shell pkg-config --libs $(PKGS) 2>/dev/null || echo -lcjson)
# refitctl init makes the CA and certificates with OpenSSL's libcrypto
# (libssl-dev); the daemons link libssl for data_tls (RPC_LIBS)
CRYPTO_LIBS := $(shell pkg-config --libs libcrypto 2>/dev/null || echo -lcrypto)

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
DEFINES := -DREFIT_DATADIR=\"$(PREFIX)/share/refit\"
CFLAGS  ?=
CFLAGS  += $(CFLAGS_COMMON) $(OPT) $(DEFINES)
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
# pure parts of the daemon the unit tests link (no gRPC, no libuv)
UNIT_DAEMON_SRC :=

# the configuration table (tests/unit/test_config.c)
UNIT_DAEMON_SRC += daemon/config.c
# the refit state machine and the coordinator's rules (test_refit_fsm.c, test_coord_rules.c)
UNIT_DAEMON_SRC += daemon/coord/refit_fsm.c daemon/coord/coord_rules.c
# naming the broken data link of a failed refit (test_blame.c)
UNIT_DAEMON_SRC += daemon/coord/coord_blame.c
# the etcd state's content-defined chunks and manifest (test_coord_chunks.c)
UNIT_DAEMON_SRC += daemon/coord/coord_chunks.c
# the node's slice executor, run over a scripted transport (test_dataplane.c)
UNIT_DAEMON_SRC += daemon/node/slice.c daemon/node/slice_build.c daemon/node/slice_group.c \
	daemon/node/slice_stream.c daemon/node/slice_delta.c daemon/node/delta_base.c
# the nccl slices' delta bases on the devices (test_gdelta_base.c)
UNIT_DAEMON_SRC += daemon/node/gdelta_base.c daemon/node/slice_gdelta.c
# the nccl transport's staging arena bookkeeping (test_pool.c)
UNIT_DAEMON_SRC += daemon/transport/gpu_arena.c
# the authorization table and the refusal log's limiter (test_auth.c)
UNIT_DAEMON_SRC += rpc/rpc_auth.c
# what an etcd Watch answer means (test_etcd_watch.c)
UNIT_DAEMON_SRC += rpc/etcd_watch_resp.c

# $(call objs,variant-dir,sources)
objs = $(patsubst %.c,$(1)/obj/%.o,$(2))

LIB      := $(BUILD)/lib/librefit-core.a
RPCLIB   := $(BUILD)/lib/librefit-rpc.a
BIN      := $(BUILD)/bin/refit-plan
REFITD   := $(BUILD)/bin/refitd
REFITCTL := $(BUILD)/bin/refitctl
UNIT     := $(BUILD)/tests/unit
BENCH    := $(BUILD)/bin/bench-plan
BENCH_RPC := $(BUILD)/bin/bench-rpc
BENCH_DP  := $(BUILD)/bin/bench-dataplane
BENCH_DELTA := $(BUILD)/bin/bench-delta
BENCH_MEMBERS := $(BUILD)/bin/bench-members
ASAN     := $(BUILD)/asan
ASAN_LIB := $(ASAN)/lib/librefit-core.a
ASAN_BIN := $(ASAN)/bin/refit-plan
ASAN_UNIT := $(ASAN)/tests/unit

.PHONY: all check demo bench bench-soak install deps clean fuzz config unit asan cli-test \
	testbed check-nccl demo-nccl figures
LIBREFIT := $(BUILD)/lib/librefit.a
REFITCLI := $(BUILD)/bin/refit-client

all: $(BIN) $(UNIT) $(BENCH) $(REFITD) $(REFITCTL) $(BUILD)/bin/bench-rpc \
     $(BUILD)/bin/bench-members \
     $(BUILD)/bin/bench-dataplane $(BENCH_DELTA) $(LIBREFIT) $(REFITCLI) $(BUILD)/tests/gpu-test \
     $(if $(HAVE_NVCC),$(GPU_KERNELS)) \
     $(BUILD)/tests/cvt-tool $(BUILD)/tests/cvt-gpu-test $(BUILD)/tests/delta-gpu-test \
     $(CUDA_CONV)

deps:
	$(Q)sh scripts/deps.sh
	$(Q)sh scripts/pydeps.sh $(BUILD)

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

# ---- the builds: one set of rules, instantiated twice ---------------------
# $(BUILD) with CFLAGS, and $(ASAN) (= $(BUILD)/asan) under ASan + UBSan.
# Each variant V has a folder DIR_V, compile flags CF_V, link flags LF_V
# and a tag for the quiet output; build_rules below holds every rule both
# share (objects, the core and RPC archives, refit-plan, refitd, refitctl,
# refit-client, the unit tests, gpu-test).
DIR_normal := $(BUILD)
CF_normal   = $(CFLAGS)
LF_normal   = $(CFLAGS)
TAG_normal := CC
DIR_asan   := $(ASAN)
CF_asan     = $(CFLAGS_COMMON) $(SAN_FLAGS) $(DEFINES)
LF_asan     = $(SAN_FLAGS)
TAG_asan   := CC-SAN
# refit-client links the client library: librefit.a in the normal build
# (what a user links), its objects under ASan
REFITCLI_LIBS_normal = $(LIBREFIT)
REFITCLI_LIBS_asan   = $(ASAN)/obj/client/librefit.o $(ASAN)/lib/librefit-rpc.a

# $(call compile,V,extra flags): the recipe that compiles $< into $@
define compile
	@mkdir -p $$(dir $$@)
	@$$(if $$(Q),printf '  %-8s%s\n' $$(TAG_$(1)) $$<)
	$$(Q)$$(CC) $(2) -c $$< -o $$@
endef

# $(call link,V,extra libraries): the recipe that links $^ into $@
define link
	@mkdir -p $$(dir $$@)
	@$$(if $$(Q),echo "  LD      $$@")
	$$(Q)$$(CC) $$(LF_$(1)) -o $$@ $$^ $(2)
endef

# $(call archive): the recipe that archives $^ into $@
define archive
	@mkdir -p $$(dir $$@)
	@$$(if $$(Q),echo "  AR      $$@")
	$$(Q)rm -f $$@ && ar rcs $$@ $$^
endef

# $(call build_rules,V)
define build_rules
$$(DIR_$(1))/obj/%.o: %.c
$(call compile,$(1),$$(CF_$(1)))

# the RPC layer, the daemon and the clients see gRPC, protobuf-c and the
# generated messages; the daemon also the CUDA / NCCL headers where found
$$(DIR_$(1))/obj/daemon/%.o: daemon/%.c $$(PROTO_C)
$(call compile,$(1),$$(CF_$(1)) $$(RPC_CFLAGS) $$(GPU_CFLAGS) -I$$(GEN))
$$(DIR_$(1))/obj/rpc/%.o: rpc/%.c $$(PROTO_C)
$(call compile,$(1),$$(CF_$(1)) $$(RPC_CFLAGS) -I$$(GEN))
$$(DIR_$(1))/obj/client/%.o: client/%.c $$(PROTO_C)
$(call compile,$(1),$$(CF_$(1)) $$(RPC_CFLAGS) -I$$(GEN))
$$(DIR_$(1))/obj/bench/%.o: bench/%.c $$(PROTO_C)
$(call compile,$(1),$$(CF_$(1)) $$(RPC_CFLAGS) -I$$(GEN))
$$(DIR_$(1))/obj/tests/unit/%.o: tests/unit/%.c
$(call compile,$(1),$$(CF_$(1)) $$(CHECK_CFLAGS))
# GPU tests: compiled in every build (a skip where the headers are missing)
$$(DIR_$(1))/obj/tests/gpu/%.o: tests/gpu/%.c $$(PROTO_C)
$(call compile,$(1),$$(CF_$(1)) $$(GPU_CFLAGS) -I$$(GEN))
# generated code: warnings are not ours to fix
$$(DIR_$(1))/obj/gen/refit.pb-c.o: $$(PROTO_C)
$(call compile,$(1),$$(filter-out $$(WERROR),$$(CF_$(1))) $$(RPC_CFLAGS) -I$$(GEN))

$$(DIR_$(1))/lib/librefit-core.a: $$(call objs,$$(DIR_$(1)),$$(LIB_SRC))
$(call archive)
$$(DIR_$(1))/lib/librefit-rpc.a: $$(call objs,$$(DIR_$(1)),$$(DAEMON_SRC)) \
		$$(DIR_$(1))/obj/gen/refit.pb-c.o
$(call archive)

$$(DIR_$(1))/bin/refit-plan: $$(call objs,$$(DIR_$(1)),client/refit_plan.c client/refit_plan_plan.c \
		client/refit_plan_model.c client/refit_plan_fw.c \
		client/refit_plan_delta.c) \
		$$(DIR_$(1))/lib/librefit-core.a
$(call link,$(1),$$(LDLIBS))
$$(DIR_$(1))/tests/unit: $$(call objs,$$(DIR_$(1)),$$(UNIT_SRC) $$(UNIT_DAEMON_SRC)) \
		$$(DIR_$(1))/lib/librefit-core.a
$(call link,$(1),$$(CHECK_LIBS) $$(LDLIBS))
$$(DIR_$(1))/bin/refitd: $$(call objs,$$(DIR_$(1)),daemon/main.c) \
		$$(DIR_$(1))/lib/librefit-rpc.a $$(DIR_$(1))/lib/librefit-core.a
$(call link,$(1),$$(RPC_LIBS) $$(LDLIBS))
$$(DIR_$(1))/bin/refitctl: $$(call objs,$$(DIR_$(1)),client/refitctl.c client/refitctl_show.c \
		client/refitctl_init.c) $$(DIR_$(1))/lib/librefit-rpc.a $$(DIR_$(1))/lib/librefit-core.a
$(call link,$(1),$$(RPC_LIBS) $$(CRYPTO_LIBS) $$(LDLIBS))
$$(DIR_$(1))/bin/refit-client: $$(call objs,$$(DIR_$(1)),client/refit_client.c) \
		$$(REFITCLI_LIBS_$(1)) $$(DIR_$(1))/lib/librefit-core.a
$(call link,$(1),$$(RPC_LIBS) $$(LDLIBS))
$$(DIR_$(1))/tests/gpu-test: $$(call objs,$$(DIR_$(1)),tests/gpu/gpu_test.c tests/gpu/gpu_copy.c tests/gpu/gpu_procs.c \
		tests/gpu/gpu_faults.c tests/gpu/gpu_order.c) \
		$$(DIR_$(1))/lib/librefit-rpc.a $$(DIR_$(1))/lib/librefit-core.a
$(call link,$(1),$$(RPC_LIBS) $$(LDLIBS) -ldl)
# the conversion kernels against the host (tests/conversion), and the C
# conversion of one tensor for the numpy cross-check
$$(DIR_$(1))/tests/cvt-gpu-test: $$(DIR_$(1))/obj/tests/conversion/cvt_gpu_test.o \
		$$(DIR_$(1))/lib/librefit-core.a
$(call link,$(1),$$(LDLIBS) -ldl)
# the delta kernels against the host codec (tests/gpu/delta_gpu_test.c)
$$(DIR_$(1))/tests/delta-gpu-test: $$(DIR_$(1))/obj/tests/gpu/delta_gpu_test.o \
		$$(DIR_$(1))/lib/librefit-core.a
$(call link,$(1),$$(LDLIBS) -ldl)
$$(DIR_$(1))/tests/cvt-tool: $$(DIR_$(1))/obj/tests/conversion/cvt_tool.o \
		$$(DIR_$(1))/lib/librefit-core.a
$(call link,$(1),$$(LDLIBS))

# benchmarks (make bench builds the normal ones)
$$(DIR_$(1))/bin/bench-plan: $$(DIR_$(1))/obj/bench/bench_plan.o $$(DIR_$(1))/lib/librefit-core.a
$(call link,$(1),$$(LDLIBS))
$$(DIR_$(1))/bin/bench-dataplane: $$(DIR_$(1))/obj/bench/bench_dataplane.o \
		$$(DIR_$(1))/lib/librefit-core.a
$(call link,$(1),$$(LDLIBS))
$$(DIR_$(1))/bin/bench-delta: $$(DIR_$(1))/obj/bench/bench_delta.o \
		$$(DIR_$(1))/lib/librefit-core.a
$(call link,$(1),$$(LDLIBS))
$$(DIR_$(1))/bin/bench-rpc: $$(DIR_$(1))/obj/bench/bench_rpc.o \
		$$(DIR_$(1))/lib/librefit-rpc.a $$(DIR_$(1))/lib/librefit-core.a
$(call link,$(1),$$(RPC_LIBS) $$(LDLIBS))
$$(DIR_$(1))/bin/bench-members: $$(DIR_$(1))/obj/bench/bench_members.o \
		$$(DIR_$(1))/lib/librefit-rpc.a $$(DIR_$(1))/lib/librefit-core.a
$(call link,$(1),$$(RPC_LIBS) $$(LDLIBS))
endef

$(eval $(call build_rules,normal))
$(eval $(call build_rules,asan))

# ---- the normal build only ------------------------------------------------
# librefit: the client library (librefit.so, librefit.a, refit.pc)
include client/librefit.mk
# the Python package (python/refit): make install
include python/install.mk
# operations: health proto, metrics
include daemon/ops.mk
# the etcd client: its generated messages
include rpc/etcd.mk

# the shared CUDA runtime: one runtime (one current device per thread) with refitd's
# (both kernel libraries: a static cudart would be a second runtime in refitd)
# (the strided copy and the conversion kernels: refitd looks both up in it)
$(GPU_KERNELS): daemon/transport/kernels.cu daemon/transport/gpu_kernels.h \
		daemon/transport/convert_kernels.cu daemon/transport/convert_kernels.h \
		dataplane/convert_elem.h dataplane/cvt_op.h daemon/transport/delta_kernels.cu \
		daemon/transport/delta_kernels.h dataplane/delta_dev.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(NVCC) -std=c++14 -O2 -shared -Xcompiler -fPIC -cudart shared -I. $(NVCC_ARCH) \
		-o $@ daemon/transport/kernels.cu daemon/transport/convert_kernels.cu \
		daemon/transport/delta_kernels.cu
$(BUILD)/lib/librefit-convert-cuda.so: daemon/transport/convert_kernels.cu \
		daemon/transport/convert_kernels.h dataplane/convert_elem.h dataplane/cvt_op.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(NVCC) -std=c++14 -O2 -I. -Xcompiler -fPIC -shared -cudart shared $(NVCC_ARCH) -o $@ $<

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
		tests/emu/emu_copy.c tests/emu/emu_convert.c tests/emu/emu_ipcev.c \
		tests/emu/emu_delta.c
EMU_NCCL_SRC := tests/emu/emu_nccl.c tests/emu/emu_group.c tests/emu/emu_boot.c \
		tests/emu/emu_p2p.c tests/emu/emu_reg.c
EMU_TEST_OBJ := test_emu.o test_cuda.o test_cuda_hw.o test_cuda_ev.o test_nccl.o
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

# the emulator's two libraries and its rule tests, built twice from these
# rules: $(EMU_DIR) and, under ASan + UBSan, $(EMU_DIR)/asan (the rule
# tests run both).  The ASan libraries leave the sanitizer runtime's
# symbols to the program (no -z defs).
EMU_DIR_normal := $(EMU_DIR)
EMU_CF_normal   = $(EMU_CFLAGS)
EMU_LF_normal  :=
EMU_DEFS_normal := -Wl,-z,defs
EMU_DIR_asan   := $(EMU_DIR)/asan
EMU_CF_asan     = $(filter-out $(OPT),$(EMU_CFLAGS)) $(SAN_FLAGS)
EMU_LF_asan     = $(SAN_FLAGS)
EMU_DEFS_asan  :=

# $(call emu_rules,V)
define emu_rules
$$(EMU_DIR_$(1))/obj/%.o: tests/emu/%.c
	@mkdir -p $$(dir $$@)
	@$$(if $$(Q),printf '  %-8s%s\n' $$(TAG_$(1)) $$<)
	$$(Q)$$(CC) $$(EMU_CF_$(1)) -c $$< -o $$@

$$(EMU_DIR_$(1))/libcudart.so.13: $$(patsubst tests/emu/%.c,$$(EMU_DIR_$(1))/obj/%.o,$$(EMU_RT_SRC))
	@$$(if $$(Q),echo "  LD      $$@")
	$$(Q)$$(CC) $$(EMU_LF_$(1)) -shared -Wl,-soname,libcudart.so.13 $$(EMU_DEFS_$(1)) -o $$@ $$^ \
		-lpthread

$$(EMU_DIR_$(1))/libnccl.so.2: $$(patsubst tests/emu/%.c,$$(EMU_DIR_$(1))/obj/%.o,$$(EMU_NCCL_SRC)) \
		$$(EMU_DIR_$(1))/libcudart.so.13
	@$$(if $$(Q),echo "  LD      $$@")
	$$(Q)$$(CC) $$(EMU_LF_$(1)) -shared -Wl,-soname,libnccl.so.2 $$(EMU_DEFS_$(1)) -o $$@ \
		$$(filter %.o,$$^) -L$$(EMU_DIR_$(1)) -l:libcudart.so.13 \
		-Wl,--disable-new-dtags,-rpath,'$$$$ORIGIN' -lpthread

$$(EMU_DIR_$(1))/test-emu: $$(addprefix $$(EMU_DIR_$(1))/obj/,$$(EMU_TEST_OBJ)) \
		$$(EMU_DIR_$(1))/libnccl.so.2 $$(EMU_DIR_$(1))/libcudart.so.13
	@$$(if $$(Q),echo "  LD      $$@")
	$$(Q)$$(CC) $$(EMU_LF_$(1)) -o $$@ $$(filter %.o,$$^) -L$$(EMU_DIR_$(1)) -l:libnccl.so.2 \
		-l:libcudart.so.13 -Wl,-rpath,'$$$$ORIGIN' -lpthread
endef

$(eval $(call emu_rules,normal))
$(eval $(call emu_rules,asan))

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
# Megatron-layout trainer -> vLLM-layout instances, in their own memory
demo: deps
	$(Q)$(MAKE) --no-print-directory $(BIN) $(REFITD) $(REFITCTL) $(LIBREFIT_SO)
	$(Q)/usr/bin/python3 scripts/demo.py $(BUILD)

# the demo over the nccl transport on the CUDA + NCCL emulator
demo-nccl: deps
	$(Q)$(MAKE) --no-print-directory $(BIN) $(REFITD) $(REFITCTL) $(REFITCLI) emu
	$(Q)DEMO_TRANSPORT=nccl sh scripts/demo.sh $(BIN)

bench: deps
	$(Q)$(MAKE) --no-print-directory $(BENCH) $(BENCH_RPC) $(BENCH_DP) $(BENCH_DELTA) \
		$(BENCH_MEMBERS) \
		$(REFITD) $(REFITCTL) $(REFITCLI)
	$(Q)$(BENCH)
	@echo
	$(Q)$(BENCH_RPC) $(REFITD)
	@echo
	$(Q)$(BENCH_DP)
	@echo
	$(Q)$(BENCH_DELTA)
	@echo
	$(Q)/usr/bin/python3 bench/bench_refit.py $(BUILD)
	@echo
	$(Q)$(BENCH_MEMBERS) $(REFITD)
	@echo
	$(Q)/usr/bin/python3 bench/bench_scale.py $(BUILD)
	@echo
	$(Q)$(MAKE) --no-print-directory bench-soak

# memory soak: RSS, fds, threads of every daemon after SOAK_REFITS refits
# (checkpoints, ascending; docs/performance.md); SOAK_RECORDS sets the
# coordinator's refit_records
SOAK_REFITS ?= 100,1000
bench-soak:
	$(Q)$(MAKE) --no-print-directory $(REFITD) $(REFITCTL) $(REFITCLI)
	$(Q)/usr/bin/python3 bench/bench_soak.py $(BUILD) --refits $(SOAK_REFITS) \
		$(if $(SOAK_RECORDS),--records $(SOAK_RECORDS))

# the figures of README.md and docs/*.md, rewritten between their
# <!-- figures:NAME --> markers (scripts/figures.py --list names them)
figures: $(BIN) $(BENCH) $(BENCH_RPC) $(BENCH_MEMBERS) $(BENCH_DELTA) $(REFITD) $(REFITCTL) \
	 $(REFITCLI)
	$(Q)/usr/bin/python3 scripts/figures.py $(BUILD) $(if $(FIGURES),--only $(FIGURES)) \
		$(if $(FIGURES_SET),--set $(FIGURES_SET))

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
