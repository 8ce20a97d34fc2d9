/* test_pipeline.c — pipelined training equals unsharded training, for the named cases of
 * docs/pipeline.md: plans with stages (per-stage TP, unequal groups, uneven layer splits, replicas
 * staged differently, interleaved chunks), micro-batches and every schedule. Each case: the loss
 * and every gradient within 1e-5 of the unsharded reference's (fp32), then 3 AdamW steps on each
 * side with the same losses and parameters. Then what the schedule promises of memory (1F1B keeps
 * fewer micro-batches' activations than GPipe), a schedule from a CSV table, and the tables the
 * checker must refuse (a W before its B, an action twice, a missing one, a deadlock).
 *
 *   test_pipeline [--backend cuda]   cuda: the named cases' sharded side trains on the CUDA
 *                                    backend (every rank on one GPU), run on the emulated GPU */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ntp_train.h"
#include "ntpc.h"
#include "ntprt.h"
#include "session_program.h"
#include "shard.h"
#include "train_compare.h"

#define GPT(S)                                                                                   \
  "model g {\n"                                                                                  \
  "  dim B = 8, S = " #S ", D = 32, H = 8, V = 37, L = 4;\n"                                      \
  "  dtype fp32;\n"                                                                              \
  "  input tokens : i32[B, S];\n"                                                                \
  "  input targets : i32[B, S];\n"                                                               \
  "  x = embed: embedding(tokens, vocab = V, dim = D, positions = S);\n"                         \
  "  repeat L as blk {\n"                                                                        \
  "    h = ln1: layernorm(x);\n"                                                                 \
  "    x = x + attn: attention(h, heads = H, causal, bias = true);\n"                            \
  "    h = ln2: layernorm(x);\n"                                                                 \
  "    x = x + mlp: mlp(h, hidden = 64, act = gelu, bias = true);\n"                             \
  "  }\n"                                                                                        \
  "  x = ln_f: layernorm(x);\n"                                                                  \
  "  logits = head: linear(x, out = V, tied = embed);\n"                                         \
  "  output loss = cross_entropy(logits, targets);\n"                                            \
  "}\n"
static const char gpt[] = GPT(8);
static const char gpt_long[] = GPT(64); /* activations, not weight gradients, fill its arena */

static const char llama[] =
    "model l {\n"
    "  dim B = 8, S = 8, D = 48, H = 12, KV = 4, V = 41, L = 6;\n"
    "  dtype fp32;\n"
    "  input tokens : i32[B, S];\n"
    "  input targets : i32[B, S];\n"
    "  x = embed: embedding(tokens, vocab = V, dim = D);\n"
    "  repeat L as blk {\n"
    "    h = n1: rmsnorm(x);\n"
    "    x = x + attn: attention(h, heads = H, kv_heads = KV, rope = 10000, causal);\n"
    "    h = n2: rmsnorm(x);\n"
    "    x = x + mlp: mlp(h, hidden = 96, act = swiglu);\n"
    "  }\n"
    "  x = nf: rmsnorm(x);\n"
    "  logits = head: linear(x, out = V);\n"
    "  output loss = cross_entropy(logits, targets);\n"
    "}\n";

typedef struct pcase {
  const char *name, *model, *plan, *schedule;
  int mb;
} pcase;

static const pcase cases[] = {
    {"GPT PP 2 x tp 4 / tp (2, 2)", gpt,
     "plan p for g { world 8; stage embed .. blk.1 ranks 0..3; stage blk.2 .. head ranks 4..7;\n"
     "  * tp 4; blk.{2..3}.* tp (2, 2); head tp (2, 2); }",
     "1f1b", 4},
    {"Llama PP 4, uneven, tp (4, 3, 2, 4)", llama,
     "plan p for l { world 13; stage embed .. blk.0 ranks 0..3; stage blk.1 .. blk.3 ranks 4..6;\n"
     "  stage blk.4 ranks 7..8; stage blk.5 .. head ranks 9..12;\n"
     "  embed tp 4; blk.0.* tp 4; blk.{1..3}.* tp 3; blk.4.* tp 2; blk.5.* tp 4; head tp 4; }",
     "1f1b", 8},
    {"DP 2 x PP 2, staged differently", gpt,
     "plan p for g { world 8;\n"
     "  pipeline { stage embed .. blk.2 ranks 0..1; stage blk.3 .. head ranks 2..3; }\n"
     "  pipeline { stage embed .. blk.0 ranks 4..5; stage blk.1 .. head ranks 6..7; }\n"
     "  * tp 2; }",
     "gpipe", 4},
    {"interleaved, 2 sets x 2 chunks", gpt,
     "plan p for g { world 4; stage embed .. blk.0 ranks 0..1; stage blk.1 ranks 2..3;\n"
     "  stage blk.2 ranks 0..1; stage blk.3 .. head ranks 2..3; * tp 2; }",
     "interleaved", 4},
    {"ZB-H1 PP 4", gpt,
     "plan p for g { world 4; stage embed .. blk.0 ranks 0..0; stage blk.1 ranks 1..1;\n"
     "  stage blk.2 ranks 2..2; stage blk.3 .. head ranks 3..3; }",
     "zb-h1", 8},
    {"recompute + sequence parallel", gpt,
     "plan p for g { world 6; stage embed .. blk.1 ranks 0..2; stage blk.2 .. head ranks 3..5;\n"
     "  * tp 3; blk.*.mlp tp 3, sequence_parallel, recompute; blk.*.attn tp (2, 1), recompute; }",
     "1f1b", 4},
    {"micro-batches alone, tp (4, 3)", llama, "plan p for l { world 7; * tp (4, 3); }", "1f1b", 3},
    {"stages 3 (even split)", gpt, "plan p for g { world 6; stages 3; * tp 2; }", "zb-h1", 6},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

static const ntp_exec_options *where; /* the sharded side's backend: NULL, the CPU simulation */

static ntpc_session *compile(const char *model, const char *plan, bool sharded, int mb, const char *sched) {
  ntpc_session *s = ntpc_session_new();
  ntpc_want_grad(s, true);
  char *src = malloc(strlen(model) + strlen(plan) + 2);
  sprintf(src, "%s%s\n", model, plan);
  if (sharded) {
    ntpc_select_plan(s, "p");
    ntpc_set_world(s, 0);
    ntpc_set_pipeline(s, mb, sched); /* a name or a FILE.csv */
    ntpc_want_cuda(s, where != NULL);
  }
  ntpc_status st = ntpc_compile_string(s, "pipeline.ntp", src);
  free(src);
  if (st != NTPC_OK) {
    ntpc_print_diags(s, stderr, 0);
    ntpc_session_free(s);
    return NULL;
  }
  return s;
}

/* the loss, every gradient and 3 AdamW steps against the unsharded run; 0 when equal */
static int equal_case(const char *name, const char *model, const char *plan, int mb, const char *sched) {
  ntpc_session *us = compile(model, plan, false, 1, NULL), *ss = compile(model, plan, true, mb, sched);
  if (!us || !ss) {
    printf("%-38s does not compile  FAIL\n", name);
    ntpc_session_free(us);
    ntpc_session_free(ss);
    return 1;
  }
  char err[512];
  ntp_program *up = session_program(us, err, sizeof err), *sp = session_program(ss, err, sizeof err);
  ntp_cpu_result ref, got;
  const char *at = "?";
  int bad = 0;
  if (!up || !sp || ntp_cpu_run(&up->global, 3, 0, &ref, err, sizeof err) != 0) {
    printf("%-38s %s  FAIL\n", name, err);
    bad = 1;
  } else if (ntp_sim_run(sp, 3, &got, err, sizeof err) != 0) {
    printf("%-38s %s  FAIL\n", name, err);
    ntp_cpu_result_free(&ref);
    bad = 1;
  } else {
    const sh_program *shp = ntpc_sharded(ss);
    double e = worst_error(&got, &ref, &at), lw = 0, pw = 0;
    size_t skipped = 0;
    int rc = adamw_compare_on(up, sp, where, 3, &lw, &pw, &skipped, err, sizeof err);
    bool ok = e <= 1e-5 && rc == 0 && lw <= 1e-5 && pw <= 1e-5;
    printf("%-38s %2d ranks, %s x %d: loss %.6f, gradients within %.1e (%s), 3 AdamW steps%s: losses %.1e, "
           "parameters %.1e  %s\n",
           name, sp->world, shp->sched.name, shp->micro_batches, ref.outputs[0].f[0], e, at, where ? " on cuda" : "", lw,
           pw, ok ? "ok" : "FAIL");
    if (rc) printf("  trainer: %s\n", err);
    bad = !ok;
    ntp_cpu_result_free(&ref);
    ntp_cpu_result_free(&got);
  }
  ntp_program_free(up);
  ntp_program_free(sp);
  ntpc_session_free(us);
  ntpc_session_free(ss);
  return bad;
}

/* 1F1B keeps at most p micro-batches' activations, GPipe all m: the first stage's arena shows it */
static void memory_of_schedules(void) {
  const char *plan = "plan p for g { world 4; stage embed .. blk.0 ranks 0..0; stage blk.1 ranks 1..1;\n"
                     "  stage blk.2 ranks 2..2; stage blk.3 .. head ranks 3..3; }";
  ntpc_session *a = compile(gpt_long, plan, true, 8, "gpipe"), *b = compile(gpt_long, plan, true, 8, "1f1b");
  CHECK(a && b);
  if (!a || !b) return;
  const sh_program *pa = ntpc_sharded(a), *pb = ntpc_sharded(b);
  printf("first stage's activation arena, 8 micro-batches on 4 stages: GPipe %.1f KiB, 1F1B %.1f KiB\n",
         (double)pa->mem[0].arena_bytes / 1024, (double)pb->mem[0].arena_bytes / 1024);
  CHECK(pb->mem[0].arena_bytes * 3 < pa->mem[0].arena_bytes * 2); /* 4 of 8 micro-batches kept: well below */
  ntpc_session_free(a);
  ntpc_session_free(b);
}

/* A table from a file: the good one trains as the generated one does; the bad ones are refused,
 * each with its own diagnostic. */
static void csv_tables(int *bad) {
  const char *plan = "plan p for g { world 2; stage embed .. blk.1 ranks 0..0; stage blk.2 .. head ranks 1..1; }";
  static const struct {
    const char *name, *rows, *want; /* want: NULL = accepted */
  } t[] = {
      {"1F1B by hand", "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n", NULL},
      {"ZB-H1 by hand", "0F0,0F1,0B0,0W0,0B1,0W1\n1F0,1B0,1F1,1B1,1W0,1W1\n", NULL},
      {"a W before its B", "0F0,0F1,0B0,0W1,0B1,0W0\n1F0,1B0,1W0,1F1,1B1,1W1\n", "a W before its B"},
      {"an action twice", "0F0,0F1,0B0,0B0,0B1\n1F0,1B0,1F1,1B1\n", "it comes twice"},
      {"an action missing", "0F0,0F1,0B0\n1F0,1B0,1F1,1B1\n", "is missing"},
      {"a chunk of another set", "0F0,0F1,1B0,0B1\n1F0,1B0,1F1,1B1\n", "does not run on this rank set"},
      {"a deadlock", "0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n", "deadlocks"},
      {"not an action", "0F0,0X1\n1F0\n", "is not an action"},
  };
  char path[64];
  snprintf(path, sizeof path, "/tmp/ntp_schedule_%d.csv", (int)getpid());
  for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(t[i].rows, f);
    fclose(f);
    if (!t[i].want) {
      char name[64];
      snprintf(name, sizeof name, "CSV: %s", t[i].name);
      *bad += equal_case(name, gpt, plan, 2, path);
      continue;
    }
    ntpc_session *s = ntpc_session_new();
    ntpc_want_grad(s, true);
    ntpc_select_plan(s, "p");
    ntpc_set_world(s, 0);
    ntpc_set_pipeline(s, 2, path);
    char src[4096];
    snprintf(src, sizeof src, "%s%s\n", gpt, plan);
    bool refused = ntpc_compile_string(s, "pipeline.ntp", src) == NTPC_ERR_INPUT;
    const char *msg = ntpc_diag_count(s) ? ntpc_diag_at(s, 0)->message : "(no diagnostic)";
    bool ok = refused && strstr(msg, t[i].want);
    printf("CSV: %-22s refused: %s  %s\n", t[i].name, msg, ok ? "ok" : "FAIL");
    *bad += !ok;
    ntpc_session_free(s);
  }
  unlink(path);
}

int main(int argc, char **argv) {
  static const ntp_exec_options cuda = {.backend = "cuda", .loopback = true};
  if (argc == 3 && !strcmp(argv[1], "--backend") && !strcmp(argv[2], "cuda")) where = &cuda;
  else if (argc != 1) {
    fprintf(stderr, "usage: test_pipeline [--backend cuda]\n");
    return 2;
  }
  int bad = 0;
  for (int c = 0; c < NCASES; c++)
    bad += equal_case(cases[c].name, cases[c].model, cases[c].plan, cases[c].mb, cases[c].schedule);
  if (!where) { /* what does not depend on the backend: once */
    memory_of_schedules();
    csv_tables(&bad);
  }
  CHECK(bad == 0);
  return check_report("pipeline");
}
