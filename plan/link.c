/*
 * link.c - which link a transfer between two ranks takes (plan.h): below
 * every planner and the cost model.
 */
#include "plan/internal.h"

plan_link_t
plan_link_of(const plan_topo_t *topo, int32_t from, int32_t to)
{
	if (from == to)
		return PLAN_LINK_LOCAL;
	if (plan_topo_domain(topo, from) == plan_topo_domain(topo, to))
		return PLAN_LINK_NVLINK;
	return PLAN_LINK_NETWORK;
}

const char *
plan_link_name(plan_link_t l)
{
	static const char *const n[] = {"local", "nvlink", "network"};

	return (unsigned)l < PLAN_LINK_COUNT ? n[l] : "?";
}
