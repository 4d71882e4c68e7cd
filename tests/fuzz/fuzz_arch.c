/*
 * fuzz_arch.c - libFuzzer harness for architecture files and Hugging Face
 * config.json files; an architecture that parses is turned into layouts
 * for a small parallel layout, which must cover every element, and into
 * the frameworks' memory maps, each of which, when built, must pass its
 * own check (pieces inside, disjoint, covering; every element held).
 */
#include <stdint.h>
#include <stdlib.h>

#include "codec/json.h"

/* Every framework map the generator builds for a must be a valid one. */
static void
maps(const plan_arch_t *a)
{
	static const struct { plan_fw_t fw; const char *par; int64_t fp8; } c[] = {
		{PLAN_FW_MEGATRON, "tp2,pp2,ep2", 0}, {PLAN_FW_VLLM, "tp2", 0},
		{PLAN_FW_SGLANG, "tp2,ep2", 0}, {PLAN_FW_FSDP2, "dp2,tp2", 0},
		{PLAN_FW_VLLM, "tp1", 128},
	};

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		plan_par_t p;
		plan_fw_map_t m;
		refit_err_t e;

		refit_err_clear(&e);
		if (plan_par_parse(c[i].par, plan_fw_trains(c[i].fw), &p, NULL) != REFIT_OK)
			abort();
		if (plan_fw_map_build(&m, a, c[i].fw, &p, c[i].fp8, &e) == REFIT_OK) {
			if (plan_fw_map_check(&m, &e) != REFIT_OK)
				abort();
		} else if (e.msg[0] == '\0') {
			abort();
		}
		plan_fw_map_fini(&m);
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	plan_arch_t a;
	plan_par_t tr, in;
	plan_layout_set_t s, d;
	refit_err_t e;

	refit_err_clear(&e);
	if (codec_arch_parse((const char *)data, size, &a, &e) != REFIT_OK) {
		if (e.msg[0] == '\0')
			abort();
		return 0;
	}
	/* keep generation small: few layers, small shapes */
	if (a.layers > 4 || a.hidden > 256 || a.vocab > 1024 || a.heads > 32 ||
	    a.experts > 64 || a.intermediate > 1024 || a.expert_intermediate > 512 ||
	    a.head_dim > 128 || a.kv_heads > 32 || a.q_lora_rank > 256 ||
	    a.kv_lora_rank > 256 || a.qk_nope_dim > 128 || a.qk_rope_dim > 128 ||
	    a.v_head_dim > 128 || a.shared_experts > 4)
		return 0;
	if (plan_par_parse("tp2,pp2,ep2", true, &tr, NULL) != REFIT_OK ||
	    plan_par_parse("tp2,dp2", false, &in, NULL) != REFIT_OK)
		abort();
	plan_layout_set_init(&s);
	plan_layout_set_init(&d);
	if (plan_model_layouts(&a, &tr, &in, &s, &d, &e) == REFIT_OK) {
		for (size_t i = 0; i < s.n; i++)
			if (plan_layout_check_coverage(&s.v[i], NULL) != REFIT_OK)
				abort();
	} else if (e.msg[0] == '\0') {
		abort();
	}
	plan_layout_set_fini(&s);
	plan_layout_set_fini(&d);
	maps(&a);
	return 0;
}
