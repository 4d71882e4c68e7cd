/*
 * transport.c - backends by name, and the clock every backend bounds its
 * waits with (see transport.h).
 */
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "daemon/transport/transport.h"

static const xport_ops_t *const backends[] = {&xport_tcp_ops, &xport_nccl_ops};

const xport_ops_t *
xport_lookup(const char *name)
{
	for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]); i++)
		if (strcmp(backends[i]->name, name) == 0)
			return backends[i];
	return NULL;
}

const char *
xport_names(void)
{
	return "tcp, nccl";
}

int64_t
xport_now_ms(void)
{
	return clock_mono_ms();
}
