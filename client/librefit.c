/*
 * librefit.c - the client library (see refit.h, docs/librefit.md): gRPC
 * calls to the node daemon's Local service over its unix socket.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/refit.h"
#include "codec/json.h"
#include "common/alloc.h"
#include "daemon/proto_conv.h"
#include "daemon/rpc.h"
#include "refit/v1/refit.pb-c.h"

struct refit {
	rpc_client_t *c;
	char msg[REFIT_ERR_MSG_MAX];
	char *node_id;
	int32_t *ranks;
	size_t nranks;
};

static int
fail(refit_t *h, const refit_err_t *e)
{
	snprintf(h->msg, sizeof(h->msg), "%s", e->msg);
	return e->status;
}

static int
call(refit_t *h, const char *method, const ProtobufCMessage *rq, ProtobufCMessage **rsp,
     int timeout_ms)
{
	refit_err_t err;

	refit_err_clear(&err);
	h->msg[0] = '\0';
	if (rpc_client_call(h->c, &refit__v1__local__descriptor, method, rq, rsp,
			    timeout_ms > 0 ? timeout_ms : 1, &err) != REFIT_OK)
		return fail(h, &err);
	return REFIT_OK;
}

const char *
refit_status_name(int status)
{
	return refit_status_str((refit_status_t)status);
}

const char *
refit_errmsg(const refit_t *h)
{
	return h ? h->msg : "no handle";
}

int
refit_open(const char *socket_path, int timeout_ms, refit_t **out, char *errbuf,
	   size_t errlen)
{
	Refit__V1__HelloRequest rq = REFIT__V1__HELLO_REQUEST__INIT;
	Refit__V1__HelloResponse *rsp = NULL;
	char target[400];
	refit_err_t err;
	refit_t *h;
	int rc;

	*out = NULL;
	refit_err_clear(&err);
	snprintf(target, sizeof(target), "unix:%s", socket_path);
	h = xcalloc(1, sizeof(*h));
	h->c = rpc_client_new(target, NULL, &err);
	if (h->c == NULL) {
		snprintf(errbuf, errlen, "%s", err.msg);
		free(h);
		return err.status;
	}
	rc = call(h, "Hello", &rq.base, (ProtobufCMessage **)&rsp, timeout_ms);
	if (rc != REFIT_OK) {
		snprintf(errbuf, errlen, "node daemon at %s: %s", socket_path, h->msg);
		refit_close(h);
		return rc;
	}
	h->node_id = xstrdup(rsp->node_id ? rsp->node_id : "");
	h->nranks = rsp->n_ranks;
	h->ranks = xcalloc(rsp->n_ranks ? rsp->n_ranks : 1, sizeof(*h->ranks));
	memcpy(h->ranks, rsp->ranks, rsp->n_ranks * sizeof(*h->ranks));
	protobuf_c_message_free_unpacked(&rsp->base, NULL);
	*out = h;
	return REFIT_OK;
}

void
refit_close(refit_t *h)
{
	if (h == NULL)
		return;
	rpc_client_free(h->c);
	free(h->node_id);
	free(h->ranks);
	free(h);
}

int
refit_node_info(refit_t *h, const char **node_id, const int32_t **ranks, size_t *n)
{
	if (node_id)
		*node_id = h->node_id;
	*ranks = h->ranks;
	*n = h->nranks;
	return REFIT_OK;
}

int
refit_register(refit_t *h, const refit_registration_t *r, uint64_t *client)
{
	Refit__V1__LocalRegisterRequest rq = REFIT__V1__LOCAL_REGISTER_REQUEST__INIT;
	Refit__V1__LocalRegisterResponse *rsp = NULL;
	Refit__V1__TensorLayout **tl = NULL;
	Refit__V1__LocalTensor *lt = NULL, **lp = NULL;
	Refit__V1__PieceMemory *pm = NULL, **pp = NULL;
	plan_layout_set_t set;
	refit_err_t err;
	int rc;

	refit_err_clear(&err);
	plan_layout_set_init(&set);
	*client = 0;
	if (r->model == NULL || r->layouts_json == NULL) {
		refit_err_set(&err, REFIT_ERR_INVALID_ARG, "register: model and layouts_json "
			      "are required");
		return fail(h, &err);
	}
	if (codec_layouts_parse(r->layouts_json, strlen(r->layouts_json), &set, NULL, &err) !=
	    REFIT_OK) {
		refit_err_prefix(&err, "register \"%s\": layouts", r->model);
		return fail(h, &err);
	}
	for (size_t i = 0; i < r->nmem && err.status == REFIT_OK; i++) {
		size_t t = 0;

		while (t < set.n && strcmp(set.v[t].name, r->mem[i].tensor ?
					   r->mem[i].tensor : "") != 0)
			t++;
		if (t == set.n)
			refit_err_set(&err, REFIT_ERR_INVALID_ARG, "register \"%s\": mem[%zu] names "
				      "tensor \"%s\", which the layouts do not have", r->model, i,
				      r->mem[i].tensor ? r->mem[i].tensor : "");
	}
	if (err.status != REFIT_OK) {
		plan_layout_set_fini(&set);
		return fail(h, &err);
	}
	tl = conv_layouts_to_proto(&set);
	lt = xcalloc(set.n + 1, sizeof(*lt));
	lp = xcalloc(set.n + 1, sizeof(*lp));
	pm = xcalloc(r->nmem + 1, sizeof(*pm));
	pp = xcalloc(r->nmem + 1, sizeof(*pp));
	for (size_t t = 0; t < set.n; t++) {
		size_t first = 0, n = 0;

		refit__v1__local_tensor__init(&lt[t]);
		lt[t].layout = tl[t];
		/* this tensor's pieces, laid out contiguously in pp */
		for (size_t i = 0; i < r->nmem; i++) {
			const refit_mem_t *m = &r->mem[i];
			size_t k;

			if (strcmp(m->tensor, set.v[t].name) != 0)
				continue;
			if (n == 0)
				first = 0;
			k = 0;
			while (pp[k])
				k++;
			if (n == 0)
				first = k;
			refit__v1__piece_memory__init(&pm[k]);
			pm[k].rank = m->rank;
			pm[k].piece = m->piece;
			pm[k].shm_name = (char *)(m->shm_name ? m->shm_name : "");
			pm[k].cuda_ipc.data = (uint8_t *)m->cuda_ipc;
			pm[k].cuda_ipc.len = m->cuda_ipc ? m->cuda_ipc_len : 0;
			pm[k].cuda_bytes = m->cuda_bytes;
			pm[k].has_cuda_device = m->cuda_ipc && m->has_cuda_device;
			pm[k].cuda_device = m->cuda_device;
			pm[k].offsets = (uint64_t *)m->offset;
			pm[k].n_offsets = r->role == REFIT_ROLE_INFER &&
					  r->install == REFIT_INSTALL_DOUBLE_BUFFER ? 2 : 1;
			pm[k].strides = (int64_t *)m->strides;
			pm[k].n_strides = m->strides ? (size_t)set.v[t].ndim : 0;
			pp[k] = &pm[k];
			n++;
		}
		lt[t].memory = n ? &pp[first] : NULL;
		lt[t].n_memory = n;
		lp[t] = &lt[t];
	}
	rq.model = (char *)r->model;
	rq.role = (Refit__V1__Role)r->role;
	rq.instance = (char *)(r->instance ? r->instance : "");
	rq.install = (Refit__V1__InstallMode)r->install;
	rq.pid = (uint32_t)getpid();
	rq.tensors = lp;
	rq.n_tensors = set.n;
	rc = call(h, "RegisterClient", &rq.base, (ProtobufCMessage **)&rsp, 30000);
	if (rc == REFIT_OK) {
		*client = rsp->client_id;
		protobuf_c_message_free_unpacked(&rsp->base, NULL);
	}
	conv_layouts_proto_free(tl, set.n);
	free(lt);
	free(lp);
	free(pm);
	free(pp);
	plan_layout_set_fini(&set);
	return rc;
}

static int
client_call(refit_t *h, const char *method, uint64_t client, uint64_t version,
	    int timeout_ms, refit_state_t *st)
{
	Refit__V1__ClientRequest rq = REFIT__V1__CLIENT_REQUEST__INIT;
	Refit__V1__ClientState *rsp = NULL;
	int rc;

	rq.client_id = client;
	rq.version = version;
	rq.timeout_ms = timeout_ms > 0 ? (uint32_t)timeout_ms : 0;
	/* the daemon answers a held call at its timeout; give the RPC a margin */
	rc = call(h, method, &rq.base, (ProtobufCMessage **)&rsp,
		  (timeout_ms > 0 ? timeout_ms : 0) + 10000);
	if (rc != REFIT_OK)
		return rc;
	if (st != NULL) {
		st->version = rsp->version;
		st->active = rsp->active;
		st->valid = rsp->valid;
		st->reading = rsp->reading;
		snprintf(st->failure, sizeof(st->failure), "%s", rsp->failure ? rsp->failure : "");
	}
	protobuf_c_message_free_unpacked(&rsp->base, NULL);
	return REFIT_OK;
}

int
refit_unregister(refit_t *h, uint64_t client)
{
	return client_call(h, "Unregister", client, 0, 0, NULL);
}

int
refit_weights_ready(refit_t *h, uint64_t client, uint64_t version, int timeout_ms)
{
	(void)timeout_ms;
	return client_call(h, "WeightsReady", client, version, 0, NULL);
}

int
refit_begin_write(refit_t *h, uint64_t client, int timeout_ms)
{
	return client_call(h, "BeginWrite", client, 0, timeout_ms, NULL);
}

int
refit_wait_version(refit_t *h, uint64_t client, uint64_t min_version, int timeout_ms,
		   refit_state_t *st)
{
	return client_call(h, "WaitVersion", client, min_version, timeout_ms, st);
}

int
refit_get_state(refit_t *h, uint64_t client, refit_state_t *st)
{
	return client_call(h, "GetState", client, 0, 0, st);
}

int
refit_shm_create(const char *name, uint64_t bytes, void **ptr, char *errbuf, size_t errlen)
{
	int fd = shm_open(name, O_RDWR | O_CREAT, 0600);
	void *p;

	*ptr = NULL;
	if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0) {
		snprintf(errbuf, errlen, "shared memory \"%s\": %s", name, strerror(errno));
		if (fd >= 0)
			close(fd);
		return REFIT_ERR_SYS;
	}
	p = bytes ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : NULL;
	close(fd);
	if (p == MAP_FAILED) {
		snprintf(errbuf, errlen, "shared memory \"%s\": mmap: %s", name, strerror(errno));
		return REFIT_ERR_SYS;
	}
	*ptr = p;
	return REFIT_OK;
}
