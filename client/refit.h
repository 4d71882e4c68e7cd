/*
 * refit.h - librefit: how a training job and an inference server talk to
 * the refit node daemon on their machine.
 *
 * See docs/librefit.md for the manual.  In short:
 *
 *   refit_t *h;
 *   refit_open("/run/refit/refitd.sock", 5000, &h, errbuf, sizeof(errbuf));
 *   refit_register(h, &reg, &client);      layouts (JSON) + memory per piece
 *   trainer:   refit_weights_ready(h, client, step, timeout_ms);
 *              refit_begin_write(h, client, timeout_ms);   before the next step writes
 *   inference: refit_wait_version(h, client, step, timeout_ms, &state);
 *   refit_close(h);
 *
 * Every call returns REFIT_OK (0) or a refit status (see refit_status_name)
 * and leaves a message naming the problem in refit_errmsg(h).  No call
 * blocks longer than its timeout.  A handle is not thread-safe: use one per
 * thread, or lock around it.
 */
#ifndef REFIT_CLIENT_REFIT_H
#define REFIT_CLIENT_REFIT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct refit refit_t;

enum { REFIT_ROLE_TRAIN = 1, REFIT_ROLE_INFER = 2 };
enum { REFIT_INSTALL_DOUBLE_BUFFER = 0, REFIT_INSTALL_IN_PLACE = 1 };

/* Memory of one piece (a rank's local tensor, or one explicit box) of a tensor. */
typedef struct refit_mem {
	const char *tensor;      /* tensor name, as in the layouts */
	int32_t rank;            /* global rank; must be served by this node */
	int32_t piece;           /* 0 for DTensor layouts; explicit: the box's index
				    among the rank's boxes of that tensor */
	const char *shm_name;    /* a segment made by refit_shm_create */
	uint64_t offset[2];      /* byte offset of copy 0 (and copy 1: double buffer) */
	const int64_t *strides;  /* in elements, one per dim; NULL: contiguous */
	/* GPU memory (nccl transport), instead of shm_name: the
	 * cudaIpcMemHandle_t of the allocation (cuda_ipc_len bytes: 64, or 66 for
	 * PyTorch's shareable handle of type 'c', as _share_cuda_() gives it) and
	 * its size; offsets are within it */
	const void *cuda_ipc;
	size_t cuda_ipc_len;
	uint64_t cuda_bytes;
	/* GPU memory: the CUDA device ordinal (in the client's process) of the
	 * allocation, when has_cuda_device; the node daemon checks it is the
	 * device it runs the rank on (it checks the memory itself either way) */
	int has_cuda_device;
	int32_t cuda_device;
	/* GPU memory: the UUID of the allocation's GPU (cuDeviceGetUuid, 16
	 * bytes; NULL: not said).  The node daemon checks it is the GPU it runs
	 * the rank on, and then ignores cuda_device: under CUDA_VISIBLE_DEVICES
	 * (Ray, vLLM, torchrun) a process numbers its GPUs from 0. */
	const uint8_t *cuda_uuid;
} refit_mem_t;

typedef struct refit_registration {
	const char *model;
	int role;                /* REFIT_ROLE_* */
	const char *instance;    /* inference instance name (replicas differ); trainer: "" */
	int install;             /* inference: REFIT_INSTALL_* */
	const char *layouts_json;/* the tensors' layouts, layout-file JSON (README) */
	const refit_mem_t *mem;
	size_t nmem;
} refit_registration_t;

typedef struct refit_state {
	uint64_t version;        /* trainer: ready version; inference: installed version */
	uint32_t active;         /* double buffer: the copy (0/1) holding version */
	int valid;               /* 0 while in-place weights are being written or after
				    a failed in-place refit */
	int reading;             /* trainer: a refit reads the buffers now */
	char failure[512];       /* the last refit that failed on this node, and why */
} refit_state_t;

/* Connect to the node daemon's socket; errbuf gets the reason on failure. */
int refit_open(const char *socket_path, int timeout_ms, refit_t **out, char *errbuf,
	       size_t errlen);
void refit_close(refit_t *h);
const char *refit_errmsg(const refit_t *h);
const char *refit_status_name(int status);

/* The node's name and the global ranks it serves (valid until refit_close). */
int refit_node_info(refit_t *h, const char **node_id, const int32_t **ranks, size_t *n);

/* Register a model's tensors and their memory; *client names it afterwards. */
int refit_register(refit_t *h, const refit_registration_t *r, uint64_t *client);
int refit_unregister(refit_t *h, uint64_t client);

/* Trainer: the buffers now hold version (it must grow). */
int refit_weights_ready(refit_t *h, uint64_t client, uint64_t version, int timeout_ms);
/*
 * Trainer with GPU memory written asynchronously (docs/gpu.md, "Stream
 * ordering"): as refit_weights_ready, with nevents CUDA IPC event handles
 * (cudaIpcEventHandle_t, REFIT_CUDA_EVENT_BYTES each, back to back in
 * events; at most REFIT_CUDA_EVENTS_MAX), each from an event created with
 * cudaEventInterprocess | cudaEventDisableTiming and recorded with
 * cudaEventRecord on a stream that wrote the weights, after its writes.
 * The node daemon's copies of this version wait for them on the GPU
 * (cudaStreamWaitEvent): no host synchronisation is needed.  Keep each
 * event alive and do not record it again until refit_begin_write returned.
 * nevents 0: as refit_weights_ready (then the writes must be complete,
 * e.g. cudaDeviceSynchronize, before the call).  (since REFIT_1.4)
 */
#define REFIT_CUDA_EVENT_BYTES 64
#define REFIT_CUDA_EVENTS_MAX 16
int refit_weights_ready_cuda(refit_t *h, uint64_t client, uint64_t version, const void *events,
			     size_t nevents, int timeout_ms);
/* Trainer: wait until no refit reads the buffers, then mark them being written
 * (refits of the old version fail cleanly until the next weights_ready). */
int refit_begin_write(refit_t *h, uint64_t client, int timeout_ms);

/* Inference: wait until version >= min_version is installed and valid. */
int refit_wait_version(refit_t *h, uint64_t client, uint64_t min_version, int timeout_ms,
		       refit_state_t *st);
int refit_get_state(refit_t *h, uint64_t client, refit_state_t *st);
/* Inference, double buffer: the reader (an engine) now serves `version`, the
 * one installed (state.active).  Until it serves another, no refit writes
 * that copy: a refit that would is refused on this node and retried by the
 * model's policy.  Without this call nothing protects a copy being read
 * after the next version is installed. */
int refit_serve(refit_t *h, uint64_t client, uint64_t version);
/* Inference: the engine reading the client names itself -- framework
 * ("vllm"), its version ("0.32.0") and pause mode ("keep", "wait" or
 * "abort") -- for operators (refitctl models shows them with the version
 * it serves); each at most 64 bytes, printable. */
int refit_describe(refit_t *h, uint64_t client, const char *framework, const char *version,
		   const char *pause_mode);
/* Trainer: wait (at most timeout_ms) until every inference instance of the
 * model holds `version` or newer, as the coordinator knows it; st->version
 * is the lowest they hold.  REFIT_ERR_TIMEOUT names the instances that lag
 * (and what each holds). */
int refit_wait_installed(refit_t *h, uint64_t client, uint64_t version, int timeout_ms,
			 refit_state_t *st);

/* Create memory the daemon accepts: a memfd of bytes sealed against
 * shrinking and growing, mapped at *ptr; name is unique in the process.
 * refit_register passes it to the daemon (SCM_RIGHTS); nothing outlives
 * the process. */
int refit_shm_create(const char *name, uint64_t bytes, void **ptr, char *errbuf,
		     size_t errlen);

/*
 * A framework's memory map (docs/frameworks.md) as JSON text: framework
 * "megatron", "vllm" or "sglang"; model a refit architecture file, a
 * Hugging Face config.json, or the text of either (starting with '{');
 * par the parallel spec ("tp4,pp2", "tp8,dp2"); quant NULL or "" (the
 * model's dtype) or "fp8-block128" (an engine's projections in fp8 with
 * 128 x 128 block scales in its weight_scale_inv); rank >= 0 for that
 * rank's parameters only, -1 for every rank.  *json is heap memory: free
 * it with refit_free.  (since REFIT_1.1)
 */
int refit_framework_map(const char *framework, const char *model, const char *par,
			const char *quant, int rank, char **json, char *errbuf, size_t errlen);
/* Free memory librefit returned (NULL is a no-op).  (since REFIT_1.1) */
void refit_free(void *p);

#ifdef __cplusplus
}
#endif

#endif
