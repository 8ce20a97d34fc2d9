/* fuzz_plan.c — plan files against fixed models: the input is a plan file (the first byte
 * chooses the model and whether --world is given); it is read as `--plan FILE`, its first
 * plan for the model made active, and the model sharded by it, verified and emitted. Then the
 * planner plans the model for a small world (1 to 4 ranks, with the input's plan pinning its
 * rules when it applied). */
#include "fuzz_common.h"
#include "ntpc.h"
#include "planner.h"
#include "shard.h"

typedef struct fixed_model {
  const char *file;
  const char *defines[8];
} fixed_model;

/* relative to the source tree (the harness runs there; see smoke.sh) */
static const fixed_model models[] = {
    {"examples/gpt2.ntp", {"B=8", "S=16", "D=64", "H=8", "V=250", "L=2"}},
    {"examples/llama_block.ntp", {"B=6", "S=16", "D=64", "H=8"}},
    {"examples/sharded_matmul.ntp", {"M=8", "K=8", "N=8"}},
    {"examples/elementwise.ntp", {NULL}},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || fuzz_autoplan_too_big(data, size)) return 0;
  const fixed_model *fm = &models[data[0] % 4];
  int32_t world = (data[0] >> 2) % 9; /* 0: the plan's world; else --world 1..8 */
  const char *path = fuzz_file(data + 1, size - 1, ".ntp");
  ntpc_session *s = ntpc_session_new();
  for (int i = 0; i < 8 && fm->defines[i]; i++) ntpc_define_str(s, fm->defines[i]);
  ntpc_add_plan_file(s, path);
  ntpc_set_world(s, world);
  ntpc_status st = ntpc_compile_file(s, fm->file);
  if (st == NTPC_ERR_INTERNAL) {
    ntpc_print_diags(s, stderr, 0);
    abort();
  }
  ntpc_print_diags(s, fuzz_sink(), 0);
  if (st == NTPC_OK) {
    FILE *out = fuzz_sink();
    ntpc_emit(s, "ir", out);
    ntpc_emit(s, "sharded-ir", out);
    ntpc_emit(s, "report", out);
    ntpc_emit(s, "rank:0", out);
    const ir_module *m = ntpc_module(s);
    plan_model *pm = plan_model_new(m, ntpc_diag_sink(s));
    plan_profile prof;
    if (pm && plan_profile_builtin("h100", &prof)) {
      plan_request rq = {.world = 1 + data[0] % 4, .prof = &prof};
      plan_solution sol = {0};
      if (plan_solve(pm, m, &rq, &sol, ntpc_diag_sink(s))) plan_write_plan(out, pm, m, &sol, "fuzzed", "// fuzz");
      plan_solution_free(&sol);
    }
    plan_model_free(pm);
  }
  ntpc_session_free(s);
  return 0;
}
