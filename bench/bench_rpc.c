/*
 * bench_rpc.c - control-plane figures: unary RPC latency against a real
 * coordinator process on loopback, and the coordinator's CPU per heartbeat
 * as the membership grows (simulated nodes of 8 ranks each, heartbeating
 * from 4 client threads).  CPU is read from /proc/PID/stat of the
 * coordinator, so the clients' own cost is not counted.
 *
 * Usage: bench-rpc [path/to/refitd]
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
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
#define THREADS 4

static int
cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static uint64_t
join(rpc_client_t *c, int node, int ranks_per_node)
{
	Refit__V1__JoinRequest rq = REFIT__V1__JOIN_REQUEST__INIT;
	Refit__V1__RankInfo rv[8], *rp[8];
	ProtobufCMessage *resp;
	char id[32];
	uint64_t member;

	snprintf(id, sizeof(id), "sim%05d", node);
	for (int i = 0; i < ranks_per_node; i++) {
		refit__v1__rank_info__init(&rv[i]);
		rv[i].rank = node * ranks_per_node + i;
		rp[i] = &rv[i];
	}
	rq.node_id = id;
	rq.ranks = rp;
	rq.n_ranks = (size_t)ranks_per_node;
	if (rpc_client_call(c, SVC, "Join", &rq.base, &resp, 10000, NULL) != REFIT_OK) {
		fprintf(stderr, "bench-rpc: join %s failed\n", id);
		exit(1);
	}
	member = ((Refit__V1__JoinResponse *)resp)->member_id;
	protobuf_c_message_free_unpacked(resp, NULL);
	return member;
}

static int
beat(rpc_client_t *c, uint64_t member)
{
	Refit__V1__HeartbeatRequest rq = REFIT__V1__HEARTBEAT_REQUEST__INIT;
	ProtobufCMessage *resp;

	rq.member_id = member;
	if (rpc_client_call(c, SVC, "Heartbeat", &rq.base, &resp, 10000, NULL) != REFIT_OK)
		return -1;
	protobuf_c_message_free_unpacked(resp, NULL);
	return 0;
}

typedef struct work {
	rpc_client_t *c;
	const uint64_t *members;
	int from, to, rounds;
	int errors;
} work_t;

static void *
beater(void *arg)
{
	work_t *w = arg;

	for (int r = 0; r < w->rounds; r++)
		for (int i = w->from; i < w->to; i++)
			w->errors += beat(w->c, w->members[i]) != 0;
	return NULL;
}

int
main(int argc, char **argv)
{
	const char *refitd = argc > 1 ? argv[1] : "build/bin/refitd";
	int port = free_port(), sizes[] = {10, 100, 1000}, total = 0;
	char addr[64], portarg[64];
	rpc_client_t *cli[THREADS];
	uint64_t *members = calloc(1000, sizeof(*members));
	double lat[2000];
	pid_t pid;

	snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
	snprintf(portarg, sizeof(portarg), "127.0.0.1:%d", port);
	pid = fork();
	if (pid == 0) {
		execl(refitd, refitd, "--role", "coordinator", "--listen", portarg,
		      "--lease-ttl-ms", "600000", "--heartbeat-ms", "60000", "--log-level", "warn",
		      (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < THREADS; i++)
		cli[i] = rpc_client_new(addr, NULL, NULL);
	for (int tries = 0; tries < 50; tries++) { /* wait for the coordinator */
		ProtobufCMessage *resp;
		Refit__V1__ListMembersRequest rq = REFIT__V1__LIST_MEMBERS_REQUEST__INIT;

		if (rpc_client_call(cli[0], SVC, "ListMembers", &rq.base, &resp, 1000, NULL) ==
		    REFIT_OK) {
			protobuf_c_message_free_unpacked(resp, NULL);
			break;
		}
		usleep(100000);
	}
	printf("refit control-plane benchmark (coordinator on loopback, one run)\n\n");
	members[0] = join(cli[0], 0, 8);
	total = 1;
	for (int i = 0; i < 2000; i++) {
		double t0 = now();

		beat(cli[0], members[0]);
		lat[i] = (now() - t0) * 1e6;
	}
	qsort(lat, 2000, sizeof(double), cmp_d);
	printf("unary Heartbeat latency, 2000 sequential calls: p50 %.0f us, p99 %.0f us, "
	       "max %.0f us\n\n", lat[1000], lat[1979], lat[1999]);
	printf("%-10s %-12s %-14s %-16s %s\n", "members", "heartbeats", "wall_s",
	       "coord_cpu_s", "coord_cpu_us/beat");
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		pthread_t th[THREADS];
		work_t w[THREADS];
		int n = sizes[s], rounds = 10000 / n < 3 ? 3 : 10000 / n, errors = 0;
		double c0, t0;

		while (total < n) {
			members[total] = join(cli[0], total, 8);
			total++;
		}
		c0 = cpu_of(pid);
		t0 = now();
		for (int i = 0; i < THREADS; i++) {
			w[i] = (work_t){cli[i], members, n * i / THREADS, n * (i + 1) / THREADS,
					rounds, 0};
			pthread_create(&th[i], NULL, beater, &w[i]);
		}
		for (int i = 0; i < THREADS; i++) {
			pthread_join(th[i], NULL);
			errors += w[i].errors;
		}
		double wall = now() - t0, cpu = cpu_of(pid) - c0;
		printf("%-10d %-12d %-14.3f %-16.3f %.1f%s\n", n, n * rounds, wall, cpu,
		       cpu * 1e6 / (n * rounds), errors ? " (errors!)" : "");
	}
	for (int i = 0; i < THREADS; i++)
		rpc_client_free(cli[i]);
	kill(pid, SIGTERM);
	waitpid(pid, NULL, 0);
	free(members);
	return 0;
}
