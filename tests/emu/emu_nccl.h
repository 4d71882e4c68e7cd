/*
 * emu_nccl.h - the emulated NCCL's communicator and its parts
 * (libnccl.so.2: emu_nccl.c API and lifecycle, emu_boot.c rendezvous,
 * emu_p2p.c grouped send/recv on the streams).
 */
#ifndef REFIT_EMU_NCCL_H
#define REFIT_EMU_NCCL_H

#include "tests/emu/emu_internal.h"

#define COMM_MAGIC 0x434f4d4du
#define WIRE_MAGIC 0x52454d55u     /* "REMU" */
#define PATH_MAX_UN 108

/* What every rank says at the rendezvous; the table every rank gets. */
typedef struct emu_peer {
	uint32_t magic;
	int32_t nranks, rank, dev, pid, pad;
	uint64_t host_hash;
	char host[64];
	char path[PATH_MAX_UN];    /* the rank's listening socket */
} emu_peer_t;

typedef struct emu_root emu_root_t;

struct ncclComm {
	uint32_t magic;
	int rank, nranks, dev;
	bool blocking;
	uint64_t uid;              /* the same on every rank of the communicator */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int refs;                  /* the handle, queued operations, the init thread */
	int pending;               /* 1 while its init or shrink runs */
	bool settled;              /* the init thread is done, *publish written */
	int launching;             /* groups not yet queued on their streams */
	int children;              /* shrinks of this communicator in progress */
	ncclResult_t err;          /* first asynchronous error */
	bool aborted;              /* ncclCommAbort */
	bool terminated;           /* ncclCommShrink(NCCL_SHRINK_ABORT) ended its operations */
	bool gone;                 /* destroyed or aborted: the handle is dead */
	int shrinks;               /* shrink generation */
	emu_peer_t *peers;
	int listen_fd, join_fd;
	char listen_path[PATH_MAX_UN];
	int *out_fd, *in_fd;       /* per peer: our sends to it; its sends to us */
	uint64_t *send_next, *send_turn, *recv_next, *recv_turn; /* tickets per peer */
	pthread_mutex_t accept_mu;
	/* init: the root to join; shrink: what to publish, and the root it runs */
	char root_path[PATH_MAX_UN];
	bool root_wait;            /* shrink: wait for the root to appear */
	ncclComm_t *publish;
	struct ncclComm *parent;
	struct ncclComm *kids;     /* shrinks of this one in progress (parent's mu) */
	struct ncclComm *sib;      /* next in the parent's kids */
	emu_root_t *own_root;
	struct ncclComm *reg_next;
	struct emu_reg *regs;      /* ncclCommRegister's buffers (mu; emu_reg.c) */
};

/* registry and references (emu_nccl.c) */
void comm_ref(ncclComm_t c);
void comm_unref(ncclComm_t c);
void comm_set_err(ncclComm_t c, ncclResult_t r, const char *fmt, ...) EMU_PRINTF(3, 4);
ncclResult_t nccl_fail(ncclResult_t r, const char *fmt, ...) EMU_PRINTF(2, 3);
/* a live communicator handle; NCCL's ncclCommEnsureReady (emu_nccl.c) */
ncclResult_t comm_check(ncclComm_t c, const char *what);
ncclResult_t comm_ready(ncclComm_t c, const char *what);
/* Wait for c's init or shrink to end: its result. */
ncclResult_t comm_wait_ready(ncclComm_t c);
/* emu_group.c: inside a group (this thread), c's init or shrink waits for
 * ncclGroupEnd (a reference taken): true; outside one, false. */
bool group_defer_init(ncclComm_t c);
/* Leave this thread inside one more group (NCCL >= 2.27.6's refused
 * destroy). */
void group_leave_open(void);
/* registrations (emu_reg.c): is [p, p + n) inside one buffer registered with
 * c; free them all (the communicator's end) */
bool emu_reg_covers(ncclComm_t c, const void *p, size_t n);
void emu_reg_free_all(ncclComm_t c);
/* A consistent view of c's state, taken under c->mu. */
typedef struct comm_flags {
	ncclResult_t err;          /* the asynchronous error */
	bool busy;                 /* an operation is still in flight */
	bool aborted;
} comm_flags_t;
comm_flags_t comm_flags(ncclComm_t c);
const char *type_name(ncclDataType_t t);
size_t type_size(ncclDataType_t t);

/* rendezvous (emu_boot.c) */
/* Start a root listening at path (in its own thread); NULL on failure. */
emu_root_t *root_start(const char *path, bool count_id, char *why, size_t n);
void root_cancel(emu_root_t *r);
void root_unref(emu_root_t *r);
/* The init/shrink thread body: listen, join the root, take the table. */
void *comm_join_main(void *arg);
/* Shut every socket of c down (abort): wakes whatever waits on them. */
void comm_shutdown_fds(ncclComm_t c);
/* Only the connections between ranks (NCCL_SHRINK_ABORT). */
void comm_shutdown_data(ncclComm_t c);
void comm_close_fds(ncclComm_t c);
/* Connected socket to a unix path; -1 (errno) on failure. */
int sock_connect(const char *path);
int sock_listen(const char *path);
int write_full(int fd, const void *p, size_t n);
int read_full(int fd, void *p, size_t n);

/* grouped send/recv (emu_p2p.c) */
typedef struct p2p {
	bool send;
	void *buf;
	size_t count, bytes;
	ncclDataType_t type;
	int peer;
	ncclComm_t comm;           /* referenced while the operation exists */
	struct CUstream_st *s;
	bool reg;                  /* its buffer lies in one registered with comm */
	uint64_t ticket;
	/* progress */
	int state;
	bool ok, mismatch;
	size_t off, hoff;
	uint8_t hbuf[32];
	uint8_t *mem;
	emu_alloc_t *pin;
} p2p_t;

/* Queue ops[0..n) (tickets taken) as one task per stream. */
void p2p_launch(p2p_t *ops, size_t n);

#endif
