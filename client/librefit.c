/*
 * librefit.c - the client library (see refit.h, docs/librefit.md): gRPC
 * calls to the node daemon's Local service over its unix socket; memory
 * (memfds sealed against shrinking and growing, made by refit_shm_create)
 * passed over the daemon's memory socket (<socket>.mem, SCM_RIGHTS).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/refit.h"
#include "codec/json.h"
#include "common/alloc.h"
#include "common/str.h"
#include "common/wire.h"
#include "rpc/proto_conv.h"
#include "rpc/rpc.h"
#include "refit/v1/refit.pb-c.h"

struct refit {
	rpc_client_t *c;
	char msg[REFIT_ERR_MSG_MAX];
	char *node_id;
	int32_t *ranks;
	size_t nranks;
	char *sock_path;
	int memsock;            /* the daemon's memory socket, -1: not yet */
	uint64_t mem_key;       /* its answer: names our segments there */
	VEC(char *) sent;       /* segments passed on memsock */
};

/* Segments refit_shm_create made in this process (memfds). */
typedef struct shm_ent {
	char *name;
	int fd;
} shm_ent_t;

static pthread_mutex_t shm_lock = PTHREAD_MUTEX_INITIALIZER;
static VEC(shm_ent_t) shm_tab;

static int
shm_fd(const char *name)
{
	int fd = -1;

	pthread_mutex_lock(&shm_lock);
	for (size_t i = 0; i < shm_tab.n && fd < 0; i++)
		if (strcmp(shm_tab.v[i].name, name) == 0)
			fd = shm_tab.v[i].fd;
	pthread_mutex_unlock(&shm_lock);
	return fd;
}

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
	h->memsock = -1;
	h->sock_path = xstrdup(socket_path);
	h->c = rpc_client_new(target, NULL, &err);
	if (h->c == NULL) {
		snprintf(errbuf, errlen, "%s", err.msg);
		free(h->sock_path);
		free(h);
		return err.status;
	}
	rc = call(h, "Hello", &rq.base, (ProtobufCMessage **)&rsp, timeout_ms);
	if (rc != REFIT_OK) {
		snprintf(errbuf, errlen, "node daemon at %s: %s", socket_path, h->msg);
		refit_close(h);
		return rc;
	}
	h->node_id = xstrdup(str_nz(rsp->node_id));
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
	if (h->memsock >= 0)
		close(h->memsock);
	for (size_t i = 0; i < h->sent.n; i++)
		free(h->sent.v[i]);
	VEC_FREE(&h->sent);
	free(h->sock_path);
	free(h->node_id);
	free(h->ranks);
	free(h);
}

/* Pass segment name's memfd to the daemon (once per handle). */
static refit_status_t
mem_pass(refit_t *h, const char *name, refit_err_t *err)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	union {
		struct cmsghdr hd;
		char b[CMSG_SPACE(sizeof(int))];
	} cb;
	struct iovec iov = {(void *)name, strlen(name)};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b,
			    .msg_controllen = sizeof(cb.b)};
	struct pollfd pf;
	uint8_t ans[1 + REFIT_ERR_MSG_MAX];
	struct cmsghdr *ch;
	ssize_t r;
	int fd = shm_fd(name);

	for (size_t i = 0; i < h->sent.n; i++)
		if (strcmp(h->sent.v[i], name) == 0)
			return REFIT_OK;
	if (fd < 0)
		return refit_err_set(err, REFIT_ERR_NOT_FOUND, "shared memory \"%s\" was not made "
				     "by refit_shm_create in this process", name);
	if (h->memsock < 0) {
		if ((size_t)snprintf(sa.sun_path, sizeof(sa.sun_path), "%s.mem", h->sock_path) >=
		    sizeof(sa.sun_path))
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "socket path \"%s\" is "
					     "too long", h->sock_path);
		h->memsock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		if (h->memsock < 0 || connect(h->memsock, (struct sockaddr *)&sa,
					      sizeof(sa)) < 0) {
			refit_err_set(err, REFIT_ERR_UNAVAILABLE, "node daemon memory socket "
				      "%s: %s", sa.sun_path, strerror(errno));
			if (h->memsock >= 0)
				close(h->memsock);
			h->memsock = -1;
			return err->status;
		}
	}
	memset(&cb, 0, sizeof(cb));
	ch = CMSG_FIRSTHDR(&mh);
	ch->cmsg_level = SOL_SOCKET;
	ch->cmsg_type = SCM_RIGHTS;
	ch->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(ch), &fd, sizeof(int));
	if (sendmsg(h->memsock, &mh, MSG_NOSIGNAL) < 0)
		return refit_err_set(err, REFIT_ERR_UNAVAILABLE, "memory socket: send \"%s\": %s",
				     name, strerror(errno));
	pf = (struct pollfd){h->memsock, POLLIN, 0};
	if (poll(&pf, 1, 10000) != 1)
		return refit_err_set(err, REFIT_ERR_TIMEOUT, "memory socket: no answer for "
				     "\"%s\" in 10 s", name);
	r = recv(h->memsock, ans, sizeof(ans) - 1, 0);
	if (r <= 0)
		return refit_err_set(err, REFIT_ERR_UNAVAILABLE, "memory socket: %s",
				     r == 0 ? "closed by the daemon" : strerror(errno));
	ans[r] = '\0';
	if (ans[0] != 0 || r != 9)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "memory \"%s\": %s", name,
				     r > 1 ? (char *)ans + 1 : "refused");
	h->mem_key = wire_get_le(ans + 1, 8);
	VEC_PUSH(&h->sent, xstrdup(name));
	return REFIT_OK;
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
	for (size_t i = 0; i < r->nmem && err.status == REFIT_OK; i++)
		if (r->mem[i].cuda_ipc == NULL && r->mem[i].shm_name && r->mem[i].shm_name[0])
			mem_pass(h, r->mem[i].shm_name, &err);
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
			pm[k].shm_name = (char *)str_nz(m->shm_name);
			pm[k].cuda_ipc.data = (uint8_t *)m->cuda_ipc;
			pm[k].cuda_ipc.len = m->cuda_ipc ? m->cuda_ipc_len : 0;
			pm[k].cuda_bytes = m->cuda_bytes;
			pm[k].has_cuda_device = m->cuda_ipc && m->has_cuda_device;
			pm[k].cuda_device = m->cuda_device;
			pm[k].cuda_uuid.data = (uint8_t *)m->cuda_uuid;
			pm[k].cuda_uuid.len = m->cuda_ipc && m->cuda_uuid ? 16 : 0;
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
	rq.instance = (char *)str_nz(r->instance);
	rq.install = (Refit__V1__InstallMode)r->install;
	rq.pid = (uint32_t)getpid();
	rq.mem_key = h->mem_key;
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

/* A Local call about one client (rq), its ClientState into *st (NULL: none). */
static int
client_call_rq(refit_t *h, const char *method, Refit__V1__ClientRequest *rq, int timeout_ms,
	       refit_state_t *st)
{
	Refit__V1__ClientState *rsp = NULL;
	int rc;

	rq->timeout_ms = timeout_ms > 0 ? (uint32_t)timeout_ms : 0;
	/* the daemon answers a held call at its timeout; give the RPC a margin */
	rc = call(h, method, &rq->base, (ProtobufCMessage **)&rsp,
		  (timeout_ms > 0 ? timeout_ms : 0) + 10000);
	if (rc != REFIT_OK)
		return rc;
	if (st != NULL) {
		st->version = rsp->version;
		st->active = rsp->active;
		st->valid = rsp->valid;
		st->reading = rsp->reading;
		snprintf(st->failure, sizeof(st->failure), "%s", str_nz(rsp->failure));
	}
	protobuf_c_message_free_unpacked(&rsp->base, NULL);
	return REFIT_OK;
}

static int
client_call(refit_t *h, const char *method, uint64_t client, uint64_t version,
	    int timeout_ms, refit_state_t *st)
{
	Refit__V1__ClientRequest rq = REFIT__V1__CLIENT_REQUEST__INIT;

	rq.client_id = client;
	rq.version = version;
	return client_call_rq(h, method, &rq, timeout_ms, st);
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
refit_weights_ready_cuda(refit_t *h, uint64_t client, uint64_t version, const void *events,
			 size_t nevents, int timeout_ms)
{
	Refit__V1__ClientRequest rq = REFIT__V1__CLIENT_REQUEST__INIT;
	ProtobufCBinaryData ev[REFIT_CUDA_EVENTS_MAX];

	if (nevents > REFIT_CUDA_EVENTS_MAX || (nevents > 0 && events == NULL)) {
		snprintf(h->msg, sizeof(h->msg), "refit_weights_ready_cuda: %zu events%s (at most "
			 "%d)", nevents, events == NULL ? " and no array" : "",
			 REFIT_CUDA_EVENTS_MAX);
		return REFIT_ERR_INVALID_ARG;
	}
	for (size_t k = 0; k < nevents; k++) {
		ev[k].data = (uint8_t *)events + k * REFIT_CUDA_EVENT_BYTES;
		ev[k].len = REFIT_CUDA_EVENT_BYTES;
	}
	(void)timeout_ms;
	rq.client_id = client;
	rq.version = version;
	rq.cuda_events = ev;
	rq.n_cuda_events = nevents;
	return client_call_rq(h, "WeightsReady", &rq, 0, NULL);
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
refit_serve(refit_t *h, uint64_t client, uint64_t version)
{
	return client_call(h, "Serve", client, version, 0, NULL);
}

int
refit_describe(refit_t *h, uint64_t client, const char *framework, const char *version,
	       const char *pause_mode)
{
	Refit__V1__ClientRequest rq = REFIT__V1__CLIENT_REQUEST__INIT;
	Refit__V1__EngineInfo e = REFIT__V1__ENGINE_INFO__INIT;

	e.framework = (char *)str_nz(framework);
	e.version = (char *)str_nz(version);
	e.pause_mode = (char *)str_nz(pause_mode);
	rq.client_id = client;
	rq.engine = &e;
	return client_call_rq(h, "Describe", &rq, 0, NULL);
}

int
refit_wait_installed(refit_t *h, uint64_t client, uint64_t version, int timeout_ms,
		     refit_state_t *st)
{
	return client_call(h, "WaitInstalled", client, version, timeout_ms, st);
}

int
refit_shm_create(const char *name, uint64_t bytes, void **ptr, char *errbuf, size_t errlen)
{
	int fd;
	void *p;

	*ptr = NULL;
	if (name == NULL || !name[0] || strlen(name) > 249 || bytes == 0 ||
	    bytes > (uint64_t)INT64_MAX) {
		snprintf(errbuf, errlen, "shared memory \"%s\": a name of 1 to 249 bytes and "
			 "a size of at least 1 byte", str_nz(name));
		return REFIT_ERR_INVALID_ARG;
	}
	pthread_mutex_lock(&shm_lock);
	for (size_t i = 0; i < shm_tab.n; i++)
		if (strcmp(shm_tab.v[i].name, name) == 0) {
			pthread_mutex_unlock(&shm_lock);
			snprintf(errbuf, errlen, "shared memory \"%s\" exists already in this "
				 "process", name);
			return REFIT_ERR_EXISTS;
		}
	/* a memfd: no name another process can open, gone with this process;
	 * sealed so that nobody can shrink it under the daemon's mapping */
	fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		snprintf(errbuf, errlen, "shared memory \"%s\": %s", name, strerror(errno));
		if (fd >= 0)
			close(fd);
		pthread_mutex_unlock(&shm_lock);
		return REFIT_ERR_SYS;
	}
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		snprintf(errbuf, errlen, "shared memory \"%s\": mmap: %s", name, strerror(errno));
		close(fd);
		pthread_mutex_unlock(&shm_lock);
		return REFIT_ERR_SYS;
	}
	VEC_PUSH(&shm_tab, ((shm_ent_t){xstrdup(name), fd}));
	pthread_mutex_unlock(&shm_lock);
	*ptr = p;
	return REFIT_OK;
}
