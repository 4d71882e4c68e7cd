/*
 * rpc_exit.c - a process's last step with gRPC: wait, bounded, until
 * gRPC's own shutdown has finished.
 *
 * Every rpc object (server, client, async engine) holds a grpc_init that
 * its free drops, but a channel holds one of its own, dropped when gRPC
 * destroys it -- after grpc_channel_destroy, on one of gRPC's threads
 * when a connection attempt or a TLS handshake was in flight.  A
 * grpc_shutdown that ends the count on one of gRPC's threads does the
 * clean-up on a detached thread (gRPC 1.51, surface/init.cc), and a
 * process that returns from main first exits while gRPC's executor
 * threads still run: their OpenSSL per-thread state (the DRBGs a
 * handshake made) is never freed, and LeakSanitizer reports it.
 *
 * grpc_is_initialized() takes gRPC's init lock, which its clean-up holds
 * from the count's zero to the last executor thread joined: a 0 means
 * done.  That lock can be held long (gRPC waits up to 10 s for its I/O
 * objects), so a helper thread asks and the caller waits on it, bounded.
 */
#include <pthread.h>
#include <stdbool.h>
#include <time.h>

#include <grpc/grpc.h>

#include "rpc/rpc.h"

typedef struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done;
} shutdown_wait_t;

static void
sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

static void *
ask_grpc(void *arg)
{
	shutdown_wait_t *w = arg;

	while (grpc_is_initialized())
		sleep_ms(5);
	pthread_mutex_lock(&w->mu);
	w->done = true;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

bool
rpc_wait_shutdown(int64_t ms)
{
	static shutdown_wait_t w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
				    false};
	struct timespec until;
	pthread_t th;
	bool done;

	if (pthread_create(&th, NULL, ask_grpc, &w) != 0)
		return false;
	pthread_detach(th);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += ms / 1000;
	until.tv_nsec += (ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&w.mu);
	while (!w.done && pthread_cond_timedwait(&w.cv, &w.mu, &until) == 0)
		;
	done = w.done;
	pthread_mutex_unlock(&w.mu);
	return done;
}
