/*
 * bench_members.c - member load on a real coordinator: N fake members Join
 * and then Heartbeat at the period the coordinator asks for (its default,
 * 2 s), spread evenly over the period, with no data plane.  The members
 * live in this one process on the daemons' asynchronous client (one
 * channel, one completion-queue thread), so the load costs the machine
 * little besides the coordinator itself.
 *
 * Reported per N: time to join all, heartbeats answered and failed in the
 * window, the coordinator's CPU (user + system from /proc/PID/stat over the
 * window, in % of one core), its RSS and threads (/proc/PID/status) and RSS
 * growth per member.
 *
 * Usage: bench-members [path/to/refitd] [N ...]   (default 1024 4096)
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench_proc.h"
#include "rpc/rpc.h"
#include "refit/v1/refit.pb-c.h"

#define SVC (&refit__v1__coordinator__descriptor)
#define JOIN_WINDOW 64        /* Joins in flight at once */
#define WARMUP_PERIODS 2
#define MEASURE_PERIODS 5

typedef struct member {
	struct bench *b;
	int idx;
	uint64_t id;
	uv_timer_t beat;
	bool busy;
} member_t;

typedef struct bench {
	uv_loop_t loop;
	rpc_async_t *rpc;
	char addr[64];
	int n, next_join, joined, join_errors;
	uint32_t period_ms;
	member_t *m;
	uint64_t beats, beat_errors, skipped;
	uv_timer_t phase;
	int stage;               /* 0 joining, 1 warm-up, 2 measuring, 3 done */
	double t_join0, t_joined, t0, c0, t1, c1;
	pid_t pid;
} bench_t;

/* VmRSS (KiB) and Threads of pid */
static void
status_of(pid_t pid, long *rss_kib, long *threads)
{
	char path[64], line[256];
	FILE *f;

	*rss_kib = *threads = 0;
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	if ((f = fopen(path, "r")) == NULL)
		return;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "VmRSS:", 6) == 0)
			*rss_kib = strtol(line + 6, NULL, 10);
		else if (strncmp(line, "Threads:", 8) == 0)
			*threads = strtol(line + 8, NULL, 10);
	}
	fclose(f);
}

static void join_next(bench_t *b);

static void
on_beat_done(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	member_t *m = arg;

	(void)msg;
	(void)resp;
	m->busy = false;
	if (m->b->stage == 2) {
		if (st == REFIT_OK)
			m->b->beats++;
		else
			m->b->beat_errors++;
	}
}

static void
on_beat(uv_timer_t *t)
{
	member_t *m = t->data;
	Refit__V1__HeartbeatRequest rq = REFIT__V1__HEARTBEAT_REQUEST__INIT;

	if (m->busy) {  /* the last one is still out: the coordinator is behind */
		m->b->skipped += m->b->stage == 2;
		return;
	}
	rq.member_id = m->id;
	if (rpc_async_call(m->b->rpc, RPC_GROUP_NONE, m->b->addr, SVC, "Heartbeat", &rq.base,
			   10000, on_beat_done, m, NULL) == REFIT_OK)
		m->busy = true;
}

static void
on_phase(uv_timer_t *t)
{
	bench_t *b = t->data;

	if (b->stage == 1) {
		b->stage = 2;
		b->t0 = now();
		b->c0 = cpu_of(b->pid);
		uv_timer_start(&b->phase, on_phase, (uint64_t)b->period_ms * MEASURE_PERIODS, 0);
		return;
	}
	b->t1 = now();
	b->c1 = cpu_of(b->pid);
	b->stage = 3;
	for (int i = 0; i < b->n; i++)
		uv_timer_stop(&b->m[i].beat);
	uv_stop(&b->loop);
}

static void
all_joined(bench_t *b)
{
	b->t_joined = now();
	for (int i = 0; i < b->n; i++) {
		uv_timer_init(&b->loop, &b->m[i].beat);
		b->m[i].beat.data = &b->m[i];
		uv_timer_start(&b->m[i].beat, on_beat,
			       (uint64_t)b->period_ms * (uint64_t)i / (uint64_t)b->n, b->period_ms);
	}
	b->stage = 1;
	uv_timer_start(&b->phase, on_phase, (uint64_t)b->period_ms * WARMUP_PERIODS, 0);
}

static void
on_joined(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	member_t *m = arg;
	bench_t *b = m->b;

	if (st != REFIT_OK) {
		if (b->join_errors++ < 3)
			fprintf(stderr, "bench-members: join %d: %s\n", m->idx, msg);
	} else {
		const Refit__V1__JoinResponse *r = (const void *)resp;

		m->id = r->member_id;
		b->period_ms = r->heartbeat_ms ? r->heartbeat_ms : 2000;
	}
	if (++b->joined == b->n)
		all_joined(b);
	else
		join_next(b);
}

static void
join_next(bench_t *b)
{
	Refit__V1__JoinRequest rq = REFIT__V1__JOIN_REQUEST__INIT;
	Refit__V1__RankInfo ri = REFIT__V1__RANK_INFO__INIT, *rp = &ri;
	char id[32], ep[32];
	member_t *m;

	if (b->next_join >= b->n)
		return;
	m = &b->m[b->next_join++];
	snprintf(id, sizeof(id), "fake%05d", m->idx);
	snprintf(ep, sizeof(ep), "127.0.0.1:%d", 20000 + m->idx);
	ri.rank = m->idx;
	rq.node_id = id;
	rq.host = "127.0.0.1";
	rq.rpc_endpoint = ep;
	rq.data_endpoint = ep;
	rq.transport = "tcp";
	rq.ranks = &rp;
	rq.n_ranks = 1;
	if (rpc_async_call(b->rpc, RPC_GROUP_NONE, b->addr, SVC, "Join", &rq.base, 30000,
			   on_joined, m, NULL) != REFIT_OK) {
		fprintf(stderr, "bench-members: cannot start a Join\n");
		exit(1);
	}
}

static pid_t
start_coordinator(const char *refitd, const char *addr)
{
	pid_t pid = fork();

	if (pid == 0) {
		execl(refitd, refitd, "--role", "coordinator", "--listen", addr, "--log-level",
		      "warn", (char *)NULL);
		_exit(127);
	}
	return pid;
}

/* Poll the coordinator until it answers (10 s at most). */
static int
wait_ready(const char *addr)
{
	rpc_client_t *c = rpc_client_new(addr, NULL, NULL);
	int ok = 0;

	for (int tries = 0; c && tries < 100 && !ok; tries++) {
		Refit__V1__ListMembersRequest rq = REFIT__V1__LIST_MEMBERS_REQUEST__INIT;
		ProtobufCMessage *resp;

		if (rpc_client_call(c, SVC, "ListMembers", &rq.base, &resp, 1000, NULL) ==
		    REFIT_OK) {
			protobuf_c_message_free_unpacked(resp, NULL);
			ok = 1;
		} else {
			usleep(100000);
		}
	}
	rpc_client_free(c);
	return ok;
}

static int
run(const char *refitd, int n)
{
	bench_t b;
	long rss0, th0, rss, th;
	double cpu;

	memset(&b, 0, sizeof(b));
	b.n = n;
	snprintf(b.addr, sizeof(b.addr), "127.0.0.1:%d", free_port());
	b.pid = start_coordinator(refitd, b.addr);
	if (!wait_ready(b.addr)) {
		fprintf(stderr, "bench-members: the coordinator at %s did not answer\n", b.addr);
		kill(b.pid, SIGKILL);
		waitpid(b.pid, NULL, 0);
		return 1;
	}
	status_of(b.pid, &rss0, &th0);
	uv_loop_init(&b.loop);
	b.rpc = rpc_async_new(&b.loop, NULL, NULL);
	b.m = calloc((size_t)n, sizeof(*b.m));
	if (b.rpc == NULL || b.m == NULL) {
		fprintf(stderr, "bench-members: out of memory\n");
		return 1;
	}
	for (int i = 0; i < n; i++)
		b.m[i] = (member_t){&b, i, 0, {0}, false};
	uv_timer_init(&b.loop, &b.phase);
	b.phase.data = &b;
	b.t_join0 = now();
	for (int i = 0; i < JOIN_WINDOW; i++)
		join_next(&b);
	uv_run(&b.loop, UV_RUN_DEFAULT);
	status_of(b.pid, &rss, &th);
	cpu = (b.c1 - b.c0) / (b.t1 - b.t0) * 100.0;
	printf("%-8d %-8.2f %-9d %-11" PRIu64 " %-8" PRIu64 " %-9.1f %-9.1f %-9.1f %-8ld %.2f\n",
	       n, b.t_joined - b.t_join0, b.join_errors, b.beats,
	       b.beat_errors + b.skipped, b.beats / (b.t1 - b.t0), cpu, rss / 1024.0, th,
	       (double)(rss - rss0) / n);
	fflush(stdout);
	/* stop: timers closed, calls cancelled, engine freed, then the coordinator */
	for (int i = 0; i < n; i++)
		if (b.m[i].beat.loop)
			uv_close((uv_handle_t *)&b.m[i].beat, NULL);
	uv_close((uv_handle_t *)&b.phase, NULL);
	rpc_async_close(b.rpc);
	uv_run(&b.loop, UV_RUN_DEFAULT);
	uv_loop_close(&b.loop);
	free(b.m);
	kill(b.pid, SIGTERM);
	waitpid(b.pid, NULL, 0);
	return b.join_errors || b.beat_errors ? 1 : 0;
}

int
main(int argc, char **argv)
{
	const char *refitd = argc > 1 ? argv[1] : "build/bin/refitd";
	int sizes[16] = {1024, 4096}, ns = 2, rc = 0;

	if (argc > 2) {
		ns = 0;
		for (int i = 2; i < argc && ns < 16; i++) {
			char *end;
			long v = strtol(argv[i], &end, 10);

			if (*end || v < 1 || v > 1000000) {
				fprintf(stderr, "bench-members: bad member count \"%s\"\n", argv[i]);
				return 2;
			}
			sizes[ns++] = (int)v;
		}
	}
	signal(SIGPIPE, SIG_IGN);
	printf("member load: N fake members (Join, then Heartbeat every heartbeat_ms the "
	       "coordinator gives, default 2000 ms), no data plane; one run, %d-period window\n\n",
	       MEASURE_PERIODS);
	printf("%-8s %-8s %-9s %-11s %-8s %-9s %-9s %-9s %-8s %s\n", "members", "join_s",
	       "join_err", "beats_ok", "late", "beats/s", "cpu_%", "rss_MiB", "threads",
	       "KiB/member");
	for (int i = 0; i < ns; i++)
		rc |= run(refitd, sizes[i]);
	return rc;
}
