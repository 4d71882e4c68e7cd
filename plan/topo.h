/*
 * topo.h - the machines a refit runs on: ranks, nodes, NVLink domains, links.
 *
 * Every rank belongs to one node and one domain (an NVLink domain; defaults
 * to its node).  Each rank has one NIC of network_gbps and one NVLink port
 * of nvlink_gbps per direction.  Named presets build regular clusters
 * ("dgx-h100", "gb200-nvl72").  Pure: the JSON form is parsed in codec/.
 */
#ifndef REFIT_PLAN_TOPO_H
#define REFIT_PLAN_TOPO_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "common/strmap.h"

typedef struct plan_topo {
	int32_t nslots;       /* rank ids 0..nslots-1 may be present */
	int32_t *rank_node;   /* node index per rank id, -1 when absent */
	int32_t *rank_domain; /* domain index per rank id, -1 when absent */
	int32_t nranks;       /* ranks present */
	char **nodes;         /* node names by index */
	int32_t nnodes;
	char **domains;       /* domain names by index */
	int32_t ndomains;
	int32_t *domain_size; /* ranks per domain */
	strmap_t node_ix, domain_ix; /* name -> index */
	double network_gbps;  /* per NIC, Gbit/s per direction */
	bool nic_per_node;    /* one NIC per node, shared by its ranks (default:
				 one per rank, as on DGX/HGX machines) */
	double nvlink_gbps;   /* per rank, Gbit/s per direction */
	double latency_network_us;
	double latency_nvlink_us;
	/* calibrated host costs for the cost model (0: not modelled, the
	 * presets' default): box copies into and out of message buffers, in
	 * Gbit/s per NIC's ranks (a rank, or a node when "nic" is "node"),
	 * and a setup time per (from, to) network pair and refit */
	double pack_gbps, unpack_gbps;
	double connection_us;
} plan_topo_t;

/* Empty topology with the dgx-h100 link figures. */
void plan_topo_init(plan_topo_t *t);
void plan_topo_fini(plan_topo_t *t);
/*
 * Add a rank; domain NULL means "same as node".  Fails on a duplicate or
 * out-of-range rank.
 */
refit_status_t plan_topo_add_rank(plan_topo_t *t, int32_t rank, const char *node,
				  const char *domain, refit_err_t *err);
/*
 * Build a named preset "NAME:RANKS" (or NAME with nranks given separately,
 * nranks > 0 overriding).  Known: dgx-h100, gb200-nvl72, hgx-h200, host.
 */
refit_status_t plan_topo_preset(plan_topo_t *t, const char *spec, int32_t nranks,
				refit_err_t *err);
/*
 * Where a refit's two jobs sit on a preset's machines.
 *   packed        rank r in node r / per_node and domain r / per_domain,
 *                 training ranks first (a domain may mix both jobs and an
 *                 instance may straddle two domains);
 *   rack-aligned  training fills whole domains from domain 0; inference
 *                 starts in a fresh domain and puts floor(per_domain /
 *                 instance) instances in each (an instance larger than a
 *                 domain takes whole domains of its own), so no instance
 *                 straddles a domain boundary.  The GPUs left over in a
 *                 used domain are present as idle ranks, numbered after
 *                 both jobs: they hold nothing, but their NICs and NVLink
 *                 ports may carry traffic.
 */
typedef enum plan_place {
	PLAN_PLACE_PACKED,
	PLAN_PLACE_RACK_ALIGNED,
} plan_place_t;

typedef struct plan_jobs {
	int32_t train_ranks;    /* ranks 0 .. train_ranks-1 */
	int32_t instances;      /* inference instances, ranks from train_ranks up */
	int32_t instance_ranks; /* ranks per instance */
} plan_jobs_t;

const char *plan_place_name(plan_place_t p);
refit_status_t plan_place_parse(const char *s, plan_place_t *out,
				    refit_err_t *err);
/* The placement a preset uses unless told: rack-aligned for gb200-nvl72
 * (racks are shared by nothing), packed for the others. */
plan_place_t plan_topo_default_placement(const char *preset);
/*
 * Build preset `name` (no ":RANKS") for the two jobs under placement pl.
 * *idle (may be NULL) gets the number of idle ranks added.  Fails on an
 * unknown preset or job sizes out of range.
 */
refit_status_t plan_topo_preset_jobs(plan_topo_t *t, const char *name,
				     const plan_jobs_t *jobs, plan_place_t pl,
				     int32_t *idle, refit_err_t *err);
/* Names of the presets, NULL-terminated, for help text. */
const char *const *plan_topo_preset_names(void);
/* Check link figures are positive and finite. */
refit_status_t plan_topo_check(const plan_topo_t *t, refit_err_t *err);

static inline int32_t
plan_topo_domain(const plan_topo_t *t, int32_t rank)
{
	return rank >= 0 && rank < t->nslots ? t->rank_domain[rank] : -1;
}

static inline int32_t
plan_topo_node(const plan_topo_t *t, int32_t rank)
{
	return rank >= 0 && rank < t->nslots ? t->rank_node[rank] : -1;
}

/* network bandwidth per NIC in bytes/s, NVLink likewise */
/* The NIC a rank sends and receives through: its own, or its node's. */
static inline int32_t
plan_topo_nic(const plan_topo_t *t, int32_t rank)
{
	return t->nic_per_node ? t->rank_node[rank] : rank;
}

static inline double
plan_topo_net_Bps(const plan_topo_t *t)
{
	return t->network_gbps * 1e9 / 8.0;
}

static inline double
plan_topo_nvl_Bps(const plan_topo_t *t)
{
	return t->nvlink_gbps * 1e9 / 8.0;
}

#endif
