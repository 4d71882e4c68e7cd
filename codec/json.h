/*
 * json.h - the JSON edge: layout, topology and plan files <-> plan structs.
 *
 * cJSON objects live only inside codec/ (and the coordinator's state
 * file, which embeds layouts as trees): parsers turn text into plan/
 * structs and emitters turn plan/ structs into text.  Every parser is
 * strict (unknown keys are errors that name the key and its object) and
 * every error names the tensor and field at fault.  Parsers take text and
 * a length, so fuzz harnesses can drive them directly.
 */
#ifndef REFIT_CODEC_JSON_H
#define REFIT_CODEC_JSON_H

#include <stddef.h>

#include "common/strbuf.h"
#include "plan/framework.h"
#include "plan/model.h"
#include "plan/plan.h"

/* Read a whole file (at most 1 GiB) into a NUL-terminated heap buffer. */
refit_status_t codec_read_file(const char *path, char **buf, size_t *len,
			       refit_err_t *err);
/* A token file (a bearer token, a secret): its text without trailing
 * newlines and blanks into *token (caller frees); an empty one is an error. */
refit_status_t codec_read_token(const char *path, char **token, refit_err_t *err);

/*
 * Parse a layout document: one tensor object or {"tensors": [...]}.
 * Tensors are appended to *out (initialised by the caller).  On error
 * nothing is appended.  *was_list tells which form it was (may be NULL).
 */
refit_status_t codec_layouts_parse(const char *text, size_t len,
				   plan_layout_set_t *out, int *was_list,
				   refit_err_t *err);
refit_status_t codec_layouts_load(const char *path, plan_layout_set_t *out,
				  int *was_list, refit_err_t *err);
/*
 * The same, from and to a parsed tree: the coordinator's state file holds
 * layouts inside its own document (no text round trip).  From: a
 * "tensors" array, checked as codec_layouts_parse does.  To: a new array
 * of explicit-form tensors (name, dtype, shape, convert, shards), the
 * caller's to free with cJSON_Delete.
 */
struct cJSON;
refit_status_t codec_layouts_from_tree(const struct cJSON *list, plan_layout_set_t *out,
				       refit_err_t *err);
struct cJSON *codec_layouts_tree(const plan_layout_set_t *s);

/* Parse a topology document into *t (initialised here). */
refit_status_t codec_topo_parse(const char *text, size_t len, plan_topo_t *t,
				refit_err_t *err);
/*
 * A topology from a file path, or from a preset "NAME:RANKS" when no such
 * file exists.
 */
refit_status_t codec_topo_load(const char *spec, plan_topo_t *t,
			       refit_err_t *err);

/* {"name": ..., "shards": [{"rank", "offset", "size"}...]} of one layout. */
void codec_boxes_json(const plan_layout_t *l, strbuf_t *out);

/* The plan as JSON: digest, options, transfers, and cost when given. */
void codec_plan_json(const plan_t *p, const plan_cost_t *cost, strbuf_t *out);

/* The cost of a plan as a JSON object. */
void codec_cost_json(const plan_cost_t *c, strbuf_t *out);

/* A readable one-screen summary of a plan and its cost. */
void codec_plan_summary(const plan_t *p, const plan_cost_t *c,
			const plan_topo_t *topo, strbuf_t *out);

/*
 * The explain table: reshard next to gather-and-broadcast, with bytes by
 * link class, busiest NIC and port, modelled time and lower bound.
 */
void codec_explain_table(const plan_t *rs, const plan_cost_t *rc,
			 const plan_t *bc, const plan_cost_t *bcc,
			 const plan_topo_t *topo, strbuf_t *out);

/* An architecture file (config/models/NAME.json). */
refit_status_t codec_arch_parse(const char *text, size_t len, plan_arch_t *a,
				refit_err_t *err);
/* From a path, or NAME looked up as DIR/NAME.json in dirs (NULL-ended). */
refit_status_t codec_arch_load(const char *spec, const char *const *dirs, plan_arch_t *a,
			       refit_err_t *err);

/* "1.50 GiB" style size into buf. */
void codec_fmt_bytes(double bytes, char *buf, size_t n);
/* "1.234 s", "12.345 ms" or "37.9 us". */
void codec_fmt_time(double s, char *buf, size_t n);

/* A framework map as JSON (docs/frameworks.md); rank < 0: every rank. */
void codec_fw_map_json(const plan_fw_map_t *m, const char *model, const char *par,
		       int32_t rank, strbuf_t *sb);

#endif
