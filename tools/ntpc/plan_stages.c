/* plan_stages.c — `ntpc plan`'s pipelines: a pipelined plan checked by compiling its text, as
 * `ntpc check --plan` will read it (docs/planner.md, "Pipelines"); the model at other batch rows
 * for the 3D search is ntpc_rows_models (compiler/api_rows.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "plan_cmd.h"
#include "shard.h"

/* the plan's text, in memory */
static char *plan_text(const plan_model *pm, const ir_module *m, const plan_solution *sol, const char *name,
                       const char *header) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return NULL;
  plan_write_plan(f, pm, m, sol, name, header);
  if (fclose(f) != 0) {
    free(buf);
    return NULL;
  }
  return buf;
}

/* the text in a temporary file the compiler reads; its path in path[] */
static bool temp_plan(const char *text, char *path, size_t cap) {
  const char *dir = getenv("TMPDIR");
  snprintf(path, cap, "%s/ntpc-plan-XXXXXX", dir && *dir ? dir : "/tmp");
  int fd = mkstemp(path);
  if (fd < 0) return false;
  FILE *f = fdopen(fd, "w");
  bool ok = f && fputs(text, f) >= 0;
  if (f) ok = fclose(f) == 0 && ok;
  else close(fd);
  if (!ok) unlink(path);
  return ok;
}

/* the compiler's figures for the busiest GPU, and whether every rank fits the cap */
static int report_program(const sh_program *p, const plan_solution *sol) {
  double need_max = 0, prm = 0, arena = 0, recv = 0;
  int32_t worst = 0;
  int64_t *wts = calloc((size_t)p->world + 1, sizeof *wts); /* the whole slices: gathered with ZeRO */
  if (wts) sh_rank_weights(p, wts);
  for (int32_t r = 0; r < p->world; r++) {
    double need = (double)(p->mem[r].param_bytes + p->mem[r].input_bytes + p->mem[r].arena_bytes);
    if (need > need_max) need_max = need, worst = r;
    double pr = (double)(p->mem[r].input_bytes + (wts ? wts[r] : p->mem[r].param_bytes));
    if (pr > prm) prm = pr;
    if ((double)p->mem[r].arena_bytes > arena) arena = (double)p->mem[r].arena_bytes;
    if ((double)p->mem[r].bytes_received > recv) recv = (double)p->mem[r].bytes_received;
  }
  free(wts);
  char b1[32], b2[32], b3[32], b4[32], b5[32];
  printf("compiler check: the %s compiles for %d ranks (%d stage%s x %d replica%s, %d micro-batch%s); busiest GPU: "
         "parameters %s, arena %s, %s in all on rank %d (predicted %s), received %s per step\n",
         sol->train ? "training program (forward, backward, gradient sync)" : "plan", p->world, sol->pp_stages,
         sol->pp_stages == 1 ? "" : "s", sol->pp_replicas, sol->pp_replicas == 1 ? "" : "s", sol->micro_batches,
         sol->micro_batches == 1 ? "" : "es", plan_fmt_bytes(prm, b1, sizeof b1), plan_fmt_bytes(arena, b2, sizeof b2),
         plan_fmt_bytes(need_max, b3, sizeof b3), worst, plan_fmt_bytes(sol->mem_peak, b4, sizeof b4),
         plan_fmt_bytes(recv, b5, sizeof b5));
  if (need_max > sol->mem_cap) {
    fprintf(stderr, "ntpc plan: internal error: the compiler's memory plan needs %s on rank %d, more than the cap %s: "
            "the planner's memory bound failed (not written)\n", plan_fmt_bytes(need_max, b1, sizeof b1), worst,
            plan_fmt_bytes(sol->mem_cap, b2, sizeof b2));
    return 3;
  }
  return 0;
}

/* Past CHECK_RANKS ranks, or with more than twice as many micro-batches as stages, compiling the
 * whole plan takes minutes and gigabytes: the check compiles one replica of the pipeline with
 * min(m, p) micro-batches of the plan's rows (ZB-H1: p + 1), whose every rank holds the same
 * slices, runs the same micro-batch size and keeps as many micro-batches in flight (1F1B:
 * min(p - i, m); ZB-H1 at most p + 1) as in the whole plan, so its memory plan is theirs. */
#define CHECK_RANKS 64

char *plan_check_pipelined(const plan_opts *o, const plan_model *pm, const ir_module *m, const plan_solution *sol,
                           const ntpc_rows_models *rows, const char *name, const char *header, int *rc) {
  char *text = plan_text(pm, m, sol, name, header), path[512], *ctext = text, def[96] = "";
  plan_solution one = *sol;
  if (sol->world > CHECK_RANKS || sol->micro_batches > 2 * sol->pp_stages) {
    one.pp_replicas = 1;
    one.world = sol->pp_stages * sol->pp_stage_world;
    int32_t keep = sol->pp_stages + (sol->schedule == 4); /* ZB-H1 keeps up to p + 1 with W to come */
    one.micro_batches = sol->micro_batches < keep ? sol->micro_batches : keep;
    snprintf(def, sizeof def, "%s=%lld", ntpc_rows_dim(rows), (long long)(sol->micro_rows * one.micro_batches));
    ctext = text ? plan_text(pm, m, &one, name, header) : NULL;
  }
  if (!ctext || !temp_plan(ctext, path, sizeof path)) {
    fprintf(stderr, "ntpc plan: error: cannot write a temporary plan file: %s\n", strerror(errno));
    if (ctext != text) free(ctext);
    free(text);
    *rc = 2;
    return NULL;
  }
  if (ctext != text) free(ctext);
  if (*def)
    printf("compiler check of one pipeline replica (%d ranks, %d micro-batch%s of %lld rows: the same stages, slices "
           "and micro-batches in flight as every replica)\n", one.world, one.micro_batches,
           one.micro_batches == 1 ? "" : "es", (long long)sol->micro_rows);
  ntpc_session *s = ntpc_session_new();
  ntpc_status st = NTPC_ERR_USAGE;
  if (s) {
    for (int i = 0; i < o->ndefines; i++) ntpc_define_str(s, o->defines[i]);
    if (*def) ntpc_define_str(s, def);
    if (o->model) ntpc_select_model(s, o->model);
    ntpc_add_plan_file(s, path);
    ntpc_select_plan(s, name);
    ntpc_set_world(s, one.world);
    ntpc_want_grad(s, sol->train);
    st = ntpc_compile_file(s, o->file);
  }
  unlink(path);
  const sh_program *p = st == NTPC_OK ? ntpc_sharded(s) : NULL;
  if (!p) {
    if (s) ntpc_print_diags(s, stderr, cli_color(o->color));
    fprintf(stderr, "ntpc plan: internal error: the compiler rejects the pipelined plan chosen for it (not written)\n");
    *rc = 3;
  } else {
    *rc = report_program(p, &one);
  }
  ntpc_session_free(s);
  if (*rc) {
    free(text);
    return NULL;
  }
  return text;
}

/* `ntpc plan --plan STAGED --fail R,...`: the survivors' staged plan (plan_failover_stages), checked by
 * compiling it for the survivors, printed and written to `path`. The exit status. */
int plan_fail_staged(const plan_opts *o, const plan_model *pm, const ir_module *m, const plan_request *rq,
                     const char *path) {
  ntpc_session *h = ntpc_session_new(), *s = NULL;
  char *buf = NULL, why[256] = "", tmp[512];
  size_t len = 0;
  int32_t *phys = NULL, nw = 0, rc = 3;
  if (!h) return 3;
  for (int i = 0; i < o->ndefines; i++) ntpc_define_str(h, o->defines[i]);
  if (o->model) ntpc_select_model(h, o->model);
  ntpc_add_plan_file(h, o->plan_file);
  if (o->plan_name) ntpc_select_plan(h, o->plan_name);
  ntpc_set_world(h, rq->world);
  FILE *f = open_memstream(&buf, &len);
  const sh_program *hp = ntpc_compile_file(h, o->file) == NTPC_OK ? ntpc_sharded(h) : NULL;
  bool ok = f && hp && plan_failover_stages(pm, m, hp, rq, f, &phys, &nw, why, sizeof why);
  if (f) fclose(f);
  if (!ok) {
    fprintf(stderr, "ntpc plan: error: no staged plan for the survivors%s%s\n", why[0] ? ": " : "", why);
    rc = 1;
    goto done;
  }
  int32_t alive = rq->world - rq->nfailed;
  printf("failure re-planning of a staged plan: %d of %d GPUs survive", alive, rq->world);
  if (nw < alive) printf(", %d run (a replica that lost a whole stage is dropped, its other GPUs idle)", nw);
  printf("; rank r of the plan is physical GPU:");
  for (int32_t r = 0; r < nw; r++) printf(" %d", phys[r]);
  printf("\n%s", buf);
  if (!temp_plan(buf, tmp, sizeof tmp)) goto done;
  if ((s = ntpc_session_new())) {
    for (int i = 0; i < o->ndefines; i++) ntpc_define_str(s, o->defines[i]);
    if (o->model) ntpc_select_model(s, o->model);
    ntpc_add_plan_file(s, tmp);
    ntpc_select_plan(s, "survivors");
    ntpc_set_world(s, nw);
    ntpc_want_grad(s, rq->train);
  }
  bool compiles = s && ntpc_compile_file(s, o->file) == NTPC_OK && ntpc_sharded(s);
  unlink(tmp);
  if (!compiles) {
    if (s) ntpc_print_diags(s, stderr, cli_color(o->color));
    fprintf(stderr, "ntpc plan: internal error: the compiler rejects the survivors' plan (not written)\n");
    goto done;
  }
  printf("compiler check: the survivors' %s compiles for %d ranks\n", rq->train ? "training program" : "plan", nw);
  FILE *out = fopen(path, "w");
  if (!out || fputs(buf, out) < 0 || fclose(out) != 0) {
    fprintf(stderr, "ntpc plan: error: cannot write %s\n", path);
    rc = 2;
    goto done;
  }
  printf("wrote %s\n", path);
  rc = 0;
done:
  free(buf);
  free(phys);
  ntpc_session_free(s);
  ntpc_session_free(h);
  return rc;
}
