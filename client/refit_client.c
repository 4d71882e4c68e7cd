/*
 * refit_client.c - refit-client: an example librefit program, used by
 * `make demo` and the end-to-end tests.
 *
 *   refit-client --socket PATH --model M --role train|infer --layouts FILE
 *                [--instance NAME] [--install double-buffer|in-place]
 *                [--version V] [--pad N] [--istride K] [--wait V] [--timeout-ms T]
 *                [--finite] [--sparse PPM] [--cuda [--gpu-devices LIST] [--async-write]]
 *
 * It asks the node daemon which ranks it serves, puts the pieces of every
 * tensor on those ranks into one POSIX shared-memory segment (two copies
 * for a double-buffered instance; --pad N adds N elements to every row, so
 * memory is strided; --istride K puts elements K apart in every row, so
 * even the innermost dim is strided), and registers.  With --cuda the
 * memory is GPU memory instead (the nccl transport): one cudaMalloc per
 * rank on the rank's device (the rank's index among the node's ranks, or
 * --gpu-devices, as the daemon's gpu_devices), holding every piece of the
 * rank and both copies at offsets, registered by its CUDA IPC handle with
 * its device; the pattern is written and checked through a host image
 * copied to and from the device.  The CUDA runtime is loaded with dlopen
 * from $REFIT_CUDA_LIBRARY (else libcudart.so.13, .so.12).  A trainer fills its pieces with a
 * pattern derived from (tensor, global element index, version) and says
 * the version is ready; an instance starts from 0xEE bytes.  Then it reads
 * commands on stdin, one per line, and answers one line each on stdout:
 *
 *   next V        trainer: begin_write, fill version V, weights_ready(V)
 *   wait V MS     instance: wait for version >= V, then check every byte
 *   check V       instance: check every byte of the active copy against V
 *   state         the client state
 *   dump DIR      instance: write every shard box of the active copy, row-major,
 *                 to DIR/<tensor>@<rank>@<shard index>.bin (conversion tests)
 *   quit
 *
 * --async-write (--cuda, trainer): `next V` queues its copies to the device
 * on a stream per rank (cudaMemcpyAsync), records an interprocess event on
 * each after them and passes the events (refit_weights_ready_cuda): the
 * node daemon's reads wait for them (docs/gpu.md, "Stream ordering").
 *
 * --finite makes a trainer's bf16, fp16 and fp32 elements finite numbers
 * (sign, an exponent in a middle range and mantissa bits from the same
 * pattern), so converted blocks are not all NaN.  --sparse PPM makes
 * versions after the first change only about PPM elements per million
 * each (the others keep the previous version's bytes), as a training step
 * changes few bf16 weights (delta refits, docs/delta.md).
 *
 * With --wait V an instance waits for V, checks, prints and exits (0 when
 * every byte matches).  Exit codes: 0 fine, 1 refit error, 2 bad usage.
 */
#include <dlfcn.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client/refit.h"
#include "codec/json.h"
#include "common/alloc.h"
#include "dataplane/view.h"

typedef struct piece {
	uint32_t tensor;
	int32_t rank, piece;
	int ndim;
	int64_t shape[PLAN_MAX_DIMS], stride[PLAN_MAX_DIMS];
	uint64_t off, bytes;
	size_t rm;           /* --cuda: its rank's allocation */
	uint64_t roff;       /* --cuda: offset of copy 0 in it */
} piece_t;

/* --cuda: one allocation per rank: copy 0 of its pieces, then copy 1 */
typedef struct rank_mem {
	int32_t rank;
	int dev;
	uint8_t *d;
	uint64_t bytes;      /* per copy */
	uint8_t ipc[64];     /* cudaIpcMemHandle_t */
	uint8_t uuid[16];    /* its GPU's UUID (cuDeviceGetUuid) */
	void *st, *ev;       /* --async-write: its stream and interprocess event */
} rank_mem_t;

static struct {
	const char *socket, *model, *layouts, *instance, *gpu_devices;
	int role, install;
	uint64_t version, wait;
	int64_t pad, istride;
	int timeout_ms;
	bool cuda, finite, async;
	uint64_t sparse;  /* --sparse: elements per million a version changes (0: all) */
} o = {.instance = "", .timeout_ms = 60000, .version = 1, .istride = 1};

static plan_layout_set_t set;
static VEC(piece_t) pieces;
static uint8_t *mem;
static uint64_t copy_bytes;
static char shm_name[128];
static VEC(rank_mem_t) rmem;

/* ---- GPU memory (--cuda): the runtime through dlopen, every return checked ---- */

enum { H2D = 1, D2H = 2 };   /* cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost */

static struct {
	int (*SetDevice)(int);
	int (*Malloc)(void **, size_t);
	int (*Free)(void *);
	int (*Memcpy)(void *, const void *, size_t, int);
	int (*IpcGetMemHandle)(void *, void *);
	const char *(*GetErrorString)(int);
	int (*DeviceGetUuid)(unsigned char *, int);  /* the driver's cuDeviceGetUuid */
	/* --async-write */
	int (*MemcpyAsync)(void *, const void *, size_t, int, void *);
	int (*StreamCreateWithFlags)(void **, unsigned);
	int (*EventCreateWithFlags)(void **, unsigned);
	int (*EventRecord)(void *, void *);
	int (*IpcGetEventHandle)(void *, void *);
	int (*StreamDestroy)(void *), (*EventDestroy)(void *);
} cu;

static void
cuda_die(int e, const char *what)
{
	printf("ERROR CUDA %s: %s (cudaError %d)\n", what, cu.GetErrorString(e), e);
	fprintf(stderr, "refit-client: %s: %s\n", what, cu.GetErrorString(e));
	exit(1);
}

#define CU(call, what)                         \
	do {                                   \
		int e_ = (call);               \
		if (e_ != 0)                   \
			cuda_die(e_, what);    \
	} while (0)

/* cuDeviceGetUuid through the runtime's driver entry points (CUDA 12.5+:
 * ByVersion; 12.0-12.4: the older call) */
static void
cuda_load_uuid(void *h)
{
	int (*byv)(const char *, void **, unsigned int, unsigned long long, int *);
	int (*ent)(const char *, void **, unsigned long long, int *);
	void *fn = NULL;
	int qr = 0, e = -1;

	*(void **)&byv = dlsym(h, "cudaGetDriverEntryPointByVersion");
	*(void **)&ent = dlsym(h, "cudaGetDriverEntryPoint");
	if (byv)
		e = byv("cuDeviceGetUuid", &fn, 12000, 0, &qr);
	else if (ent)
		e = ent("cuDeviceGetUuid", &fn, 0, &qr);
	if (e != 0 || fn == NULL) {
		fprintf(stderr, "refit-client: --cuda: the driver's cuDeviceGetUuid is not "
			"available (%d)\n", e);
		exit(1);
	}
	*(void **)&cu.DeviceGetUuid = fn;
}

static void
cuda_load(void)
{
	const char *env = getenv("REFIT_CUDA_LIBRARY");
	const char *names[] = {env && env[0] ? env : "libcudart.so.13", "libcudart.so.12", NULL};
	void *h = NULL;

	for (int i = 0; names[i] && h == NULL; i++)
		h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		fprintf(stderr, "refit-client: --cuda: cannot load the CUDA runtime (%s): %s\n",
			names[0], dlerror());
		exit(1);
	}
	*(void **)&cu.SetDevice = dlsym(h, "cudaSetDevice");
	*(void **)&cu.Malloc = dlsym(h, "cudaMalloc");
	*(void **)&cu.Free = dlsym(h, "cudaFree");
	*(void **)&cu.Memcpy = dlsym(h, "cudaMemcpy");
	*(void **)&cu.IpcGetMemHandle = dlsym(h, "cudaIpcGetMemHandle");
	*(void **)&cu.GetErrorString = dlsym(h, "cudaGetErrorString");
	if (!cu.SetDevice || !cu.Malloc || !cu.Free || !cu.Memcpy || !cu.IpcGetMemHandle ||
	    !cu.GetErrorString) {
		fprintf(stderr, "refit-client: --cuda: the CUDA runtime lacks a symbol\n");
		exit(1);
	}
	cuda_load_uuid(h);
	*(void **)&cu.MemcpyAsync = dlsym(h, "cudaMemcpyAsync");
	*(void **)&cu.StreamCreateWithFlags = dlsym(h, "cudaStreamCreateWithFlags");
	*(void **)&cu.EventCreateWithFlags = dlsym(h, "cudaEventCreateWithFlags");
	*(void **)&cu.EventRecord = dlsym(h, "cudaEventRecord");
	*(void **)&cu.IpcGetEventHandle = dlsym(h, "cudaIpcGetEventHandle");
	*(void **)&cu.StreamDestroy = dlsym(h, "cudaStreamDestroy");
	*(void **)&cu.EventDestroy = dlsym(h, "cudaEventDestroy");
}

/* --async-write: copy 0 of every piece to the device, queued on its rank's
 * stream; an interprocess event recorded after them on each (their handles
 * into evh, REFIT_CUDA_EVENT_BYTES each); the number of events. */
static size_t
cuda_async_copy(uint8_t *evh)
{
	if (!cu.MemcpyAsync || !cu.StreamCreateWithFlags || !cu.EventCreateWithFlags ||
	    !cu.EventRecord || !cu.IpcGetEventHandle || !cu.StreamDestroy || !cu.EventDestroy) {
		fprintf(stderr, "refit-client: --async-write: the CUDA runtime lacks a symbol\n");
		exit(1);
	}
	for (size_t i = 0; i < pieces.n; i++) {
		const piece_t *p = &pieces.v[i];
		rank_mem_t *r = &rmem.v[p->rm];

		CU(cu.SetDevice(r->dev), "cudaSetDevice");
		if (r->st == NULL) {   /* cudaStreamNonBlocking; interprocess, no timing */
			CU(cu.StreamCreateWithFlags(&r->st, 1), "cudaStreamCreateWithFlags");
			CU(cu.EventCreateWithFlags(&r->ev, 0x04 | 0x02), "cudaEventCreateWithFlags");
		}
		CU(cu.MemcpyAsync(r->d + p->roff, mem + p->off, p->bytes, H2D, r->st),
		   "cudaMemcpyAsync to the device");
	}
	for (size_t k = 0; k < rmem.n; k++) {
		CU(cu.SetDevice(rmem.v[k].dev), "cudaSetDevice");
		CU(cu.EventRecord(rmem.v[k].ev, rmem.v[k].st), "cudaEventRecord");
		CU(cu.IpcGetEventHandle(evh + k * REFIT_CUDA_EVENT_BYTES, rmem.v[k].ev),
		   "cudaIpcGetEventHandle");
	}
	return rmem.n;
}

/* Copy c of every piece: host image -> device (to_dev) or back. */
static void
cuda_sync_copy(int c, bool to_dev)
{
	for (size_t i = 0; i < pieces.n; i++) {
		const piece_t *p = &pieces.v[i];
		const rank_mem_t *r = &rmem.v[p->rm];
		uint8_t *h = mem + (c ? copy_bytes : 0) + p->off;
		uint8_t *d = r->d + (c ? r->bytes : 0) + p->roff;

		CU(cu.SetDevice(r->dev), "cudaSetDevice");
		if (to_dev)
			CU(cu.Memcpy(d, h, p->bytes, H2D), "cudaMemcpy to the device");
		else
			CU(cu.Memcpy(h, d, p->bytes, D2H), "cudaMemcpy from the device");
	}
}

/* At exit too: errors are reported, not fatal (exit may be under way). */
static void
cuda_free_all(void)
{
	for (size_t i = 0; i < rmem.n; i++) {
		int e;

		if (rmem.v[i].d == NULL)
			continue;
		if (rmem.v[i].st) {   /* cudaFree below waits for its copies */
			cu.SetDevice(rmem.v[i].dev);
			cu.EventDestroy(rmem.v[i].ev);
			cu.StreamDestroy(rmem.v[i].st);
		}
		if ((e = cu.SetDevice(rmem.v[i].dev)) != 0 || (e = cu.Free(rmem.v[i].d)) != 0)
			fprintf(stderr, "refit-client: freeing the memory of rank %d: %s\n",
				rmem.v[i].rank, cu.GetErrorString(e));
		rmem.v[i].d = NULL;
	}
}

static uint64_t
mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* --sparse: the version whose pattern element g of tensor t holds at
 * version v (the last one at or before v that changed it). */
static uint64_t
version_of(uint64_t g, uint64_t t, uint64_t v)
{
	if (o.sparse == 0)
		return v;
	for (uint64_t w = v; w > 1; w--)
		if (mix(g ^ t << 48 ^ w << 32 ^ 0xd1b54a32d192ed03ull) % 1000000 < o.sparse)
			return w;
	return v ? 1 : 0;
}

/* --finite: the pattern h as a finite float of dtype (else h unchanged). */
static uint64_t
finite_bits(plan_dtype_t dt, uint64_t h)
{
	uint64_t sign = (h >> 15) & 1;

	if (!o.finite)
		return h;
	if (dt == PLAN_DT_BF16)
		return sign << 15 | (112 + ((h >> 16) & 31)) << 7 | (h & 0x7f);
	if (dt == PLAN_DT_FP16)
		return sign << 15 | (1 + ((h >> 16) % 30)) << 10 | (h & 0x3ff);
	if (dt == PLAN_DT_FP32)
		return sign << 31 | (112 + ((h >> 32) & 31)) << 23 | (h & 0x7fffff);
	return h;
}

/* Write every shard box of the pieces in copy base to dir; files written. */
static int
dump_all(const uint8_t *base, const char *dir)
{
	int files = 0;

	for (size_t i = 0; i < pieces.n; i++) {
		const piece_t *p = &pieces.v[i];
		const plan_layout_t *l = &set.v[p->tensor];
		uint32_t elem = plan_dtype_size(l->dtype);

		for (size_t s = 0; s < l->nshards; s++) {
			const plan_shard_t *sh = &l->shards[s];
			int64_t idx[PLAN_MAX_DIMS] = {0}, n = plan_box_volume(&sh->box, l->ndim);
			char path[1024];
			FILE *f;

			if (sh->rank != p->rank || sh->piece != p->piece)
				continue;
			snprintf(path, sizeof(path), "%s/%s@%d@%zu.bin", dir, l->name, sh->rank, s);
			if ((f = fopen(path, "wb")) == NULL)
				return -1;
			for (int64_t e = 0; e < n; e++) {
				uint64_t loc = 0;

				for (int d = 0; d < l->ndim; d++)
					loc += (uint64_t)(sh->local_off[d] + idx[d]) *
					       (uint64_t)p->stride[d];
				if (fwrite(base + p->off + loc * elem, elem, 1, f) != 1) {
					fclose(f);
					return -1;
				}
				for (int d = l->ndim - 1; d >= 0; d--)
					if (++idx[d] < sh->box.size[d])
						break;
					else
						idx[d] = 0;
			}
			if (fclose(f) != 0)
				return -1;
			files++;
		}
	}
	return files;
}

/* Fill (fill true) or check one piece of copy base against version v. */
static uint64_t
walk(const piece_t *p, uint8_t *base, uint64_t v, bool fill)
{
	const plan_layout_t *l = &set.v[p->tensor];
	uint32_t elem = plan_dtype_size(l->dtype);
	uint64_t bad = 0;

	for (size_t s = 0; s < l->nshards; s++) {
		const plan_shard_t *sh = &l->shards[s];
		int64_t idx[PLAN_MAX_DIMS] = {0};
		int64_t n = plan_box_volume(&sh->box, l->ndim);

		if (sh->rank != p->rank || sh->piece != p->piece)
			continue;
		for (int64_t e = 0; e < n; e++) {
			uint64_t g = 0, loc = 0, h, w;
			uint8_t *q;

			for (int d = 0; d < l->ndim; d++) {
				g = g * (uint64_t)l->shape[d] + (uint64_t)(sh->box.off[d] + idx[d]);
				loc += (uint64_t)(sh->local_off[d] + idx[d]) * (uint64_t)p->stride[d];
			}
			w = version_of(g, p->tensor, v);
			h = finite_bits(l->dtype, mix(g ^ ((uint64_t)p->tensor << 48) ^ (w << 32) ^ w));
			q = base + p->off + loc * elem;
			for (uint32_t b = 0; b < elem; b++) {
				uint8_t want = (uint8_t)(h >> (8 * (b % 8)));

				if (fill)
					q[b] = want;
				else if (q[b] != want)
					bad++;
			}
			for (int d = l->ndim - 1; d >= 0; d--)
				if (++idx[d] < sh->box.size[d])
					break;
				else
					idx[d] = 0;
		}
	}
	return bad;
}

static uint64_t
walk_all(uint8_t *base, uint64_t v, bool fill)
{
	uint64_t bad = 0;

	for (size_t i = 0; i < pieces.n; i++)
		bad += walk(&pieces.v[i], base, v, fill);
	return bad;
}

static bool
served(const int32_t *r, size_t n, int32_t x)
{
	for (size_t i = 0; i < n; i++)
		if (r[i] == x)
			return true;
	return false;
}

static int
usage(void)
{
	fprintf(stderr, "usage: refit-client --socket PATH --model M --role train|infer "
		"--layouts FILE [--instance NAME] [--install double-buffer|in-place] "
		"[--version V] [--pad N] [--istride K] [--wait V] [--timeout-ms T] [--finite] "
		"[--sparse PPM] [--cuda [--gpu-devices LIST] [--async-write]]\n");
	return 2;
}

int
main(int argc, char **argv)
{
	static const struct option lo[] = {
		{"socket", 1, 0, 's'}, {"model", 1, 0, 'm'}, {"role", 1, 0, 'r'},
		{"layouts", 1, 0, 'l'}, {"instance", 1, 0, 'i'}, {"install", 1, 0, 'I'},
		{"version", 1, 0, 'v'}, {"pad", 1, 0, 'p'}, {"wait", 1, 0, 'w'},
		{"timeout-ms", 1, 0, 't'}, {"cuda", 0, 0, 'C'}, {"gpu-devices", 1, 0, 'G'},
		{"istride", 1, 0, 'S'}, {"finite", 0, 0, 'f'}, {"sparse", 1, 0, 'D'},
		{"async-write", 0, 0, 'A'}, {0, 0, 0, 0}};
	char errbuf[512], line[256];
	refit_t *h;
	const int32_t *ranks;
	size_t nranks;
	const char *node_id;
	refit_err_t err;
	VEC(refit_mem_t) rm = {0};
	VEC(int64_t *) strides = {0};
	refit_registration_t reg;
	uint64_t client, off = 0;
	char *text;
	size_t len;
	int c, rc;

	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 's': o.socket = optarg; break;
		case 'm': o.model = optarg; break;
		case 'l': o.layouts = optarg; break;
		case 'i': o.instance = optarg; break;
		case 'v': o.version = strtoull(optarg, NULL, 10); break;
		case 'p': o.pad = strtoll(optarg, NULL, 10); break;
		case 'w': o.wait = strtoull(optarg, NULL, 10); break;
		case 't': o.timeout_ms = atoi(optarg); break;
		case 'C': o.cuda = true; break;
		case 'G': o.gpu_devices = optarg; break;
		case 'S': o.istride = strtoll(optarg, NULL, 10); break;
		case 'f': o.finite = true; break;
		case 'A': o.async = true; break;
		case 'D': o.sparse = strtoull(optarg, NULL, 10); break;
		case 'r':
			o.role = strcmp(optarg, "train") == 0 ? REFIT_ROLE_TRAIN :
				 strcmp(optarg, "infer") == 0 ? REFIT_ROLE_INFER : 0;
			break;
		case 'I':
			o.install = strcmp(optarg, "in-place") == 0 ? REFIT_INSTALL_IN_PLACE :
				    strcmp(optarg, "double-buffer") == 0 ?
				    REFIT_INSTALL_DOUBLE_BUFFER : -1;
			break;
		default: return usage();
		}
	}
	if (!o.socket || !o.model || !o.layouts || !o.role || o.install < 0 || o.pad < 0 ||
	    o.istride < 1 || (o.gpu_devices && !o.cuda) || (o.async && !o.cuda))
		return usage();
	if (o.cuda)
		cuda_load();
	refit_err_clear(&err);
	if (codec_read_file(o.layouts, &text, &len, &err) != REFIT_OK ||
	    codec_layouts_parse(text, len, &set, NULL, &err) != REFIT_OK) {
		fprintf(stderr, "refit-client: %s\n", err.msg);
		return 2;
	}
	/* the daemon may be (re)starting: retry an unreachable socket */
	for (int tries = 0; (rc = refit_open(o.socket, 2000, &h, errbuf, sizeof(errbuf))) ==
			    REFIT_ERR_UNAVAILABLE && tries < o.timeout_ms / 100; tries++)
		usleep(100 * 1000);
	if (rc != 0) {
		fprintf(stderr, "refit-client: %s\n", errbuf);
		return 1;
	}
	refit_node_info(h, &node_id, &ranks, &nranks);
	/* the pieces this node serves, one after the other */
	for (uint32_t t = 0; t < set.n; t++) {
		const plan_layout_t *l = &set.v[t];

		for (size_t s = 0; s < l->nshards; s++) {
			piece_t p = {.tensor = t, .rank = l->shards[s].rank,
				     .piece = l->shards[s].piece, .ndim = l->ndim};
			bool seen = false;
			int64_t st = 1;

			if (!served(ranks, nranks, p.rank))
				continue;
			for (size_t k = 0; k < pieces.n && !seen; k++)
				seen = pieces.v[k].tensor == t && pieces.v[k].rank == p.rank &&
				       pieces.v[k].piece == p.piece;
			if (seen)
				continue;
			dp_local_shape(l, p.rank, p.piece, p.shape, &err);
			for (int d = l->ndim - 1; d >= 0; d--) {
				if (d == l->ndim - 1) {
					p.stride[d] = o.istride;
					st = o.istride * (p.shape[d] ? p.shape[d] : 1) + o.pad;
				} else {
					p.stride[d] = st;
					st *= p.shape[d];
				}
			}
			if (l->ndim == 0)
				st = 1;
			p.off = off;
			p.bytes = (uint64_t)st * plan_dtype_size(l->dtype);
			off += (p.bytes + 63) & ~63ull;
			VEC_PUSH(&pieces, p);
		}
	}
	copy_bytes = off ? off : 64;
	/* a memfd (librefit): nothing outlives this process, however it ends */
	snprintf(shm_name, sizeof(shm_name), "refit-client-%d", (int)getpid());
	if (refit_shm_create(shm_name, 2 * copy_bytes, (void **)&mem, errbuf,
			     sizeof(errbuf)) != 0) {
		fprintf(stderr, "refit-client: %s\n", errbuf);
		return 1;
	}
	memset(mem, 0xee, 2 * copy_bytes);
	if (o.cuda) { /* one allocation per rank, on its device */
		const char *gd = o.gpu_devices;

		for (size_t k = 0; k < nranks; k++) {
			rank_mem_t r = {.rank = ranks[k], .dev = (int)k};

			if (gd) {
				char *end;

				r.dev = (int)strtol(gd, &end, 10);
				if (end == gd || (*end != ',' && *end != '\0')) {
					fprintf(stderr, "refit-client: --gpu-devices \"%s\": one device "
						"per rank of the node, comma-separated\n",
						o.gpu_devices);
					return 2;
				}
				gd = *end ? end + 1 : end;
			}
			VEC_PUSH(&rmem, r);
		}
		for (size_t i = 0; i < pieces.n; i++) {
			piece_t *p = &pieces.v[i];

			for (p->rm = 0; rmem.v[p->rm].rank != p->rank; p->rm++)
				;
			p->roff = rmem.v[p->rm].bytes;
			rmem.v[p->rm].bytes += (p->bytes + 255) & ~255ull;
		}
		atexit(cuda_free_all);
		for (size_t k = 0; k < rmem.n; k++) {
			rank_mem_t *r = &rmem.v[k];

			if (r->bytes == 0)
				continue;
			CU(cu.SetDevice(r->dev), "cudaSetDevice");
			CU(cu.Malloc((void **)&r->d, 2 * r->bytes), "cudaMalloc");
			CU(cu.IpcGetMemHandle(r->ipc, r->d), "cudaIpcGetMemHandle");
			if (cu.DeviceGetUuid(r->uuid, r->dev) != 0) {
				fprintf(stderr, "refit-client: cuDeviceGetUuid(%d) failed\n", r->dev);
				return 1;
			}
		}
	}
	for (size_t i = 0; i < pieces.n; i++) {
		const piece_t *p = &pieces.v[i];
		refit_mem_t m = {set.v[p->tensor].name, p->rank, p->piece, shm_name,
				 {p->off, copy_bytes + p->off}, NULL, NULL, 0, 0, 0, 0, NULL};

		if (o.cuda) {
			const rank_mem_t *r = &rmem.v[p->rm];

			m.shm_name = NULL;
			m.offset[0] = p->roff;
			m.offset[1] = r->bytes + p->roff;
			m.cuda_ipc = r->ipc;
			m.cuda_ipc_len = sizeof(r->ipc);
			m.cuda_bytes = 2 * r->bytes;
			m.has_cuda_device = 1;
			m.cuda_device = r->dev;
			m.cuda_uuid = r->uuid;
		}
		if (o.pad || o.istride != 1) {
			int64_t *s = xmalloc(PLAN_MAX_DIMS * sizeof(*s));

			memcpy(s, p->stride, sizeof(p->stride));
			VEC_PUSH(&strides, s);
			m.strides = s;
		}
		VEC_PUSH(&rm, m);
	}
	if (o.role == REFIT_ROLE_TRAIN)
		walk_all(mem, o.version, true);
	if (o.cuda) {
		cuda_sync_copy(0, true);
		if (o.role == REFIT_ROLE_INFER)
			cuda_sync_copy(1, true);
	}
	memset(&reg, 0, sizeof(reg));
	reg.model = o.model;
	reg.role = o.role;
	reg.instance = o.instance;
	reg.install = o.install;
	reg.layouts_json = text;
	reg.mem = rm.v;
	reg.nmem = rm.n;
	/* a node daemon that just started may not have joined yet: retry that */
	for (int tries = 0; (rc = refit_register(h, &reg, &client)) == REFIT_ERR_UNAVAILABLE &&
			    tries < o.timeout_ms / 100; tries++)
		usleep(100 * 1000);
	if (rc != 0) {
		printf("ERROR %s %s\n", refit_status_name(rc), refit_errmsg(h));
		fflush(stdout);   /* before any exit-time report (LeakSanitizer) */
		fprintf(stderr, "refit-client: %s\n", refit_errmsg(h));
		return 1;
	}
	if (o.role == REFIT_ROLE_TRAIN) {
		if ((rc = refit_weights_ready(h, client, o.version, o.timeout_ms)) != 0) {
			printf("ERROR %s %s\n", refit_status_name(rc), refit_errmsg(h));
			return 1;
		}
		printf("READY %" PRIu64 " %" PRIu64 " pieces=%zu bytes=%" PRIu64 " node=%s\n",
		       client, o.version, pieces.n, off, node_id);
	} else {
		printf("REGISTERED %" PRIu64 " pieces=%zu bytes=%" PRIu64 " node=%s\n", client,
		       pieces.n, off, node_id);
	}
	fflush(stdout);
	if (o.wait) {
		refit_state_t st;

		rc = refit_wait_version(h, client, o.wait, o.timeout_ms, &st);
		if (rc != 0) {
			printf("ERROR %s %s\n", refit_status_name(rc), refit_errmsg(h));
			return 1;
		}
		uint64_t bad;

		if (o.cuda)
			cuda_sync_copy(st.active ? 1 : 0, false);
		bad = walk_all(mem + (st.active ? copy_bytes : 0), st.version, false);

		printf("INSTALLED %" PRIu64 " active=%u valid=%d mismatches=%" PRIu64
		       " bytes=%" PRIu64 "\n", st.version, st.active, st.valid, bad, off);
		refit_unregister(h, client);
		refit_close(h);
		return bad ? 1 : 0;
	}
	while (fgets(line, sizeof(line), stdin)) {
		refit_state_t st;
		uint64_t v = 0;
		int ms = 0;

		memset(&st, 0, sizeof(st));
		if (sscanf(line, "next %" SCNu64, &v) == 1) {
			rc = refit_begin_write(h, client, o.timeout_ms);
			if (rc == 0 && o.async && rmem.n <= REFIT_CUDA_EVENTS_MAX) {
				uint8_t evh[REFIT_CUDA_EVENTS_MAX * REFIT_CUDA_EVENT_BYTES];
				size_t n;

				walk_all(mem, v, true);
				n = cuda_async_copy(evh);
				rc = refit_weights_ready_cuda(h, client, v, evh, n, o.timeout_ms);
			} else if (rc == 0) {
				walk_all(mem, v, true);
				if (o.cuda)
					cuda_sync_copy(0, true);
				rc = refit_weights_ready(h, client, v, o.timeout_ms);
			}
			if (rc == 0)
				printf("READY %" PRIu64 " %" PRIu64 "\n", client, v);
		} else if (sscanf(line, "wait %" SCNu64 " %d", &v, &ms) >= 1) {
			rc = refit_wait_version(h, client, v, ms ? ms : o.timeout_ms, &st);
			if (rc == 0 && o.cuda)
				cuda_sync_copy(st.active ? 1 : 0, false);
			if (rc == 0)
				printf("INSTALLED %" PRIu64 " active=%u valid=%d mismatches=%" PRIu64
				       "\n", st.version, st.active, st.valid,
				       walk_all(mem + (st.active ? copy_bytes : 0), st.version,
						false));
		} else if (sscanf(line, "check %" SCNu64, &v) == 1) {
			rc = refit_get_state(h, client, &st);
			if (rc == 0 && o.cuda)
				cuda_sync_copy(st.active ? 1 : 0, false);
			if (rc == 0)
				printf("CHECK %" PRIu64 " mismatches=%" PRIu64 "\n", v,
				       walk_all(mem + (st.active ? copy_bytes : 0), v, false));
		} else if (strncmp(line, "state", 5) == 0) {
			rc = refit_get_state(h, client, &st);
			if (rc == 0)
				printf("STATE version=%" PRIu64 " active=%u valid=%d reading=%d "
				       "failure=%s\n", st.version, st.active, st.valid, st.reading,
				       st.failure);
		} else if (strncmp(line, "dump ", 5) == 0) {
			char dir[200];
			int nf;

			rc = sscanf(line, "dump %199s", dir) == 1 ? refit_get_state(h, client, &st) : 2;
			if (rc == 0) {
				nf = dump_all(mem + (st.active ? copy_bytes : 0), dir);
				if (nf < 0)
					printf("ERROR SYS cannot write into %s\n", dir);
				else
					printf("DUMPED %d version=%" PRIu64 "\n", nf, st.version);
				fflush(stdout);
				continue;
			}
		} else if (strncmp(line, "quit", 4) == 0) {
			break;
		} else {
			printf("ERROR INVALID_ARG unknown command\n");
			fflush(stdout);
			continue;
		}
		if (rc != 0)
			printf("ERROR %s %s\n", refit_status_name(rc), refit_errmsg(h));
		fflush(stdout);
	}
	refit_unregister(h, client);
	refit_close(h);
	for (size_t i = 0; i < strides.n; i++)
		free(strides.v[i]);
	VEC_FREE(&strides);
	VEC_FREE(&rm);
	cuda_free_all();
	VEC_FREE(&rmem);
	VEC_FREE(&pieces);
	plan_layout_set_fini(&set);
	free(text);
	return 0;
}
