/*
 * framework_json.c - a framework map as JSON (docs/frameworks.md): the
 * logical tensors, then every rank's parameters with their pieces and
 * padding.  Output only; maps are generated, never read back.
 */
#include <stdio.h>

#include "codec/json.h"

static void
tensors_json(const plan_fw_map_t *m, strbuf_t *sb)
{
	strbuf_puts(sb, "\"tensors\": [");
	for (size_t i = 0; i < m->tensors.n; i++) {
		const plan_fw_tensor_t *t = &m->tensors.v[i];

		strbuf_puts(sb, i ? ",\n  {\"name\": " : "\n  {\"name\": ");
		strbuf_json_str(sb, t->name);
		strbuf_printf(sb, ", \"dtype\": \"%s\", \"shape\": ", plan_dtype_name(t->dtype));
		strbuf_i64_list(sb, t->shape, t->ndim);
		if (t->scale >= 0)
			strbuf_printf(sb, ", \"convert\": {\"from\": \"%s\", \"block\": [%lld, %lld]}",
				      plan_dtype_name(t->from), (long long)m->fp8_block,
				      (long long)m->fp8_block);
		strbuf_puts(sb, "}");
	}
	strbuf_puts(sb, "]");
}

static void
param_json(const plan_fw_map_t *m, const plan_fw_param_t *p, strbuf_t *sb)
{
	strbuf_puts(sb, "{\"name\": ");
	strbuf_json_str(sb, p->name);
	strbuf_printf(sb, ", \"dtype\": \"%s\", \"shape\": ", plan_dtype_name(p->dtype));
	strbuf_i64_list(sb, p->shape, p->ndim);
	strbuf_puts(sb, ",\n     \"pieces\": [");
	for (size_t k = 0; k < p->npieces; k++) {
		const plan_fw_piece_t *pc = &m->pieces.v[p->piece0 + k];
		int nd = m->tensors.v[pc->tensor].ndim;

		strbuf_puts(sb, k ? ", {\"tensor\": " : "{\"tensor\": ");
		strbuf_json_str(sb, m->tensors.v[pc->tensor].name);
		strbuf_puts(sb, ", \"offset\": ");
		strbuf_i64_list(sb, pc->box.off, nd);
		strbuf_puts(sb, ", \"size\": ");
		strbuf_i64_list(sb, pc->box.size, nd);
		strbuf_puts(sb, ", \"at\": ");
		strbuf_i64_list(sb, pc->at, p->ndim);
		strbuf_puts(sb, "}");
	}
	strbuf_puts(sb, "], \"padding\": [");
	for (size_t k = 0; k < p->npads; k++) {
		const plan_box_t *b = &m->pads.v[p->pad0 + k];

		strbuf_puts(sb, k ? ", {\"at\": " : "{\"at\": ");
		strbuf_i64_list(sb, b->off, p->ndim);
		strbuf_puts(sb, ", \"size\": ");
		strbuf_i64_list(sb, b->size, p->ndim);
		strbuf_puts(sb, "}");
	}
	strbuf_puts(sb, "]}");
}

void
codec_fw_map_json(const plan_fw_map_t *m, const char *model, const char *par, int32_t rank,
		  strbuf_t *sb)
{
	int32_t r0 = rank < 0 ? 0 : rank, r1 = rank < 0 ? (int32_t)m->world : rank + 1;

	strbuf_printf(sb, "{\"framework\": \"%s\", \"model\": ", plan_fw_name(m->fw));
	strbuf_json_str(sb, model);
	strbuf_puts(sb, ", \"par\": ");
	strbuf_json_str(sb, par);
	strbuf_printf(sb, ", \"world\": %lld, \"fp8_block\": %lld,\n ", (long long)m->world,
		      (long long)m->fp8_block);
	tensors_json(m, sb);
	strbuf_puts(sb, ",\n \"ranks\": [");
	for (int32_t r = r0; r < r1; r++) {
		strbuf_printf(sb, "%s\n  {\"rank\": %d, \"params\": [", r > r0 ? "," : "", r);
		for (size_t i = m->rank0[r]; i < m->rank0[r + 1]; i++) {
			strbuf_puts(sb, i > m->rank0[r] ? ",\n    " : "\n    ");
			param_json(m, &m->params.v[i], sb);
		}
		strbuf_puts(sb, "]}");
	}
	strbuf_puts(sb, "]}\n");
}
