/* train_failover.c — `ntpc train --fail-at`: what happens when GPUs fail. Their ranks are let go
 * on the executor (exec.h: the backend aborts what waits on them); the planner re-plans from the
 * healthy plan with the failed GPUs removed (plan_failover_solve, what `ntpc plan --fail` prints),
 * the plan is written to a temporary file and the model compiled under it with its gradient pass,
 * as `ntpc train --plan` would; a trainer on the survivors takes the state from the surviving
 * replicas. */
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exec.h"
#include "planner.h"
#include "session_program.h"
#include "train_failover.h"

ntpc_session *train_session(const train_source *src, bool grad, int32_t world, const char *plan_file,
                             const char *plan_name, const int32_t *gpus, char *err, size_t cap) {
  ntpc_session *s = ntpc_session_new();
  if (!s) {
    snprintf(err, cap, "out of memory");
    return NULL;
  }
  for (int i = 0; i < src->ndefines; i++) ntpc_define_str(s, src->defines[i]);
  if (src->model) ntpc_select_model(s, src->model);
  if (plan_file && ntpc_add_plan_file(s, plan_file) != NTPC_OK) {
    snprintf(err, cap, "%s", ntpc_last_error(s));
    ntpc_session_free(s);
    return NULL;
  }
  if (plan_name) ntpc_select_plan(s, plan_name);
  ntpc_set_world(s, world);
  if (src->micro_batches >= 1 || src->schedule) ntpc_set_pipeline(s, src->micro_batches, src->schedule);
  ntpc_want_grad(s, grad);
  ntpc_want_cuda(s, grad && src->kernels);
  if (gpus) ntpc_set_rank_gpus(s, gpus, world); /* the survivors' failure domains are their GPUs' */
  if (!cli_optimizer_apply("ntpc train", s, &src->opt)) {
    snprintf(err, cap, "the distributed optimizer's options: %s", ntpc_last_error(s));
    ntpc_session_free(s);
    return NULL;
  }
  if (ntpc_compile_file(s, src->file) != NTPC_OK) {
    const ntpc_diag *d = ntpc_diag_count(s) ? ntpc_diag_at(s, 0) : NULL;
    snprintf(err, cap, "the survivors' plan does not compile: %s", d ? d->message : ntpc_last_error(s));
    ntpc_session_free(s);
    return NULL;
  }
  return s;
}

ntpc_session *train_replan_session(const train_source *src, int32_t world, const replan_ask *ask, bool grad,
                                   int32_t **phys, char *err, size_t cap) {
  const int32_t *failed = ask->failed, nfailed = ask->nfailed;
  *phys = NULL;
  plan_model *pm = NULL;
  plan_failover f;
  bool solved = false;
  char path[] = "/tmp/ntp-survivors-XXXXXX";
  int fd = -1;
  ntpc_session *healthy = train_session(src, false, world, src->plan_file, src->plan_name, NULL, err, cap), *next = NULL;
  if (!healthy) return NULL;
  const ir_module *m = ntpc_module(healthy);
  const sh_program *hp = ntpc_sharded(healthy);
  bool staged = hp && hp->pipes.npipes; /* the survivors' stages: plan_failover_stages */
  if (!(pm = plan_model_new(m, ntpc_diag_sink(healthy)))) {
    snprintf(err, cap, "the planner cannot read the model");
    goto done;
  }
  plan_profile prof;
  plan_profile_builtin("h100", &prof);
  plan_request rq = {.world = world, .prof = &prof, .failed = failed, .nfailed = nfailed, .slow = ask->slow, .pipe_scale = ask->pipe_scale, .train = true};
  if (!staged && (!(solved = plan_failover_solve(pm, m, &rq, &f, ntpc_diag_sink(healthy))) || !f.survivors.feasible)) {
    snprintf(err, cap, "no plan for the %d survivors%s%s", world - nfailed, solved ? ": " : "",
             solved ? f.survivors.why : "");
    goto done;
  }
  FILE *out = (fd = mkstemp(path)) >= 0 ? fdopen(fd, "w") : NULL;
  if (!out) {
    snprintf(err, cap, "cannot write the survivors' plan to %s", path);
    goto done;
  }
  fd = -1; /* the FILE owns it */
  int32_t nworld = 0, *sphys = NULL;
  char why[256] = "";
  bool written = true;
  if (staged) {
    written = plan_failover_stages(pm, m, hp, &rq, out, &sphys, &nworld, why, sizeof why);
  } else {
    plan_write_plan(out, pm, m, &f.survivors, "survivors", "the survivors' plan (ntpc train --fail-at)");
    nworld = f.survivors.world;
    if ((sphys = malloc((size_t)nworld * sizeof *sphys))) memcpy(sphys, f.survivors.phys, (size_t)nworld * sizeof *sphys);
  }
  if (fclose(out) != 0 || !written || !sphys) {
    snprintf(err, cap, written ? "cannot write the survivors' plan to %s" : "no staged plan for the survivors: %s",
             written ? path : why);
    free(sphys);
    goto done;
  }
  train_source keep = *src; /* the healthy plan's distributed optimizer goes on on the survivors */
  const ir_plan *hpl = m->active_plan >= 0 ? &m->plans[m->active_plan] : NULL;
  if (keep.opt.zero < 0 && keep.opt.redundancy < 0 && hpl && hpl->zero_loc.first_line)
    keep.opt.zero = hpl->zero, keep.opt.redundancy = hpl->redundancy;
  if (keep.opt.domain_size < 0 && hpl && hpl->domain_size) keep.opt.domain_size = hpl->domain_size;
  if (!(next = train_session(&keep, grad, nworld, path, "survivors", sphys, err, cap))) {
    free(sphys);
    goto done;
  }
  *phys = sphys;
  FILE *in = fopen(path, "r"); /* the plan, for the log */
  char line[512];
  size_t used = 0;
  if (ask->log && ask->log_cap) ask->log[0] = 0;
  while (in && fgets(line, sizeof line, in))
    if (line[0] == ' ' && (strchr(line, ';') || strchr(line, '{') || strchr(line, '}') || strstr(line, "// packed") || strstr(line, "// dropped")) &&
        !strstr(line, "optimizer")) {
      if (!ask->log) printf("  %s", line);
      else if (used + strlen(line) + 3 < ask->log_cap) used += (size_t)snprintf(ask->log + used, ask->log_cap - used, "  %s", line);
    }
  if (in) fclose(in);
  if (keep.opt.zero > 0 && !ask->log)
    printf("  the distributed optimizer goes on: zero %d, redundancy %d\n", keep.opt.zero,
           keep.opt.redundancy > 0 ? keep.opt.redundancy : 1);
done:
  if (fd >= 0) close(fd);
  unlink(path);
  if (solved) plan_failover_free(&f);
  plan_model_free(pm);
  ntpc_session_free(healthy);
  return next;
}

ntp_program *train_replan(const train_source *src, int32_t world, const replan_ask *ask, int32_t **phys, char *err,
                          size_t cap) {
  ntpc_session *s = train_replan_session(src, world, ask, true, phys, err, cap);
  ntp_program *prog = s ? session_program(s, err, cap) : NULL;
  ntpc_session_free(s);
  if (!prog) free(*phys), *phys = NULL;
  return prog;
}

bool train_parse_events(const char *v, long *steps, int32_t *ranks, int *n) {
  for (const char *p = v;;) {
    char *end;
    long st = strtol(p, &end, 10), r;
    if (*n == 64 || end == p || *p < '0' || *p > '9' || st < 1 || st > 1000000000 || *end != ':') return false;
    p = end + 1;
    r = strtol(p, &end, 10);
    if (end == p || *p < '0' || *p > '9' || r > 4095) return false;
    steps[*n] = st;
    ranks[(*n)++] = (int32_t)r;
    if (!*(p = end)) return true;
    if (*p++ != ',') return false;
  }
}

double train_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* GPUs now[] join the failed ones; false with err when one is not a live GPU of the world or none
 * would be left */
static bool note_failed(failover_run *fr, long step, const int32_t *now, int nnow, char *err, size_t cap) {
  for (int k = 0; k < nnow; k++) {
    bool known = false;
    for (int32_t j = 0; j < fr->nfailed; j++) known |= fr->failed[j] == now[k];
    if (now[k] >= fr->world0 || known) {
      snprintf(err, cap, "--fail-at %ld:%d: GPU %d is %s", step, now[k], now[k],
               known ? "down already" : "not in the world");
      return false;
    }
    fr->failed[fr->nfailed++] = now[k];
  }
  if (fr->nfailed >= fr->world0) {
    snprintf(err, cap, "--fail-at: no GPU survives");
    return false;
  }
  printf("step %4ld: GPU", step);
  for (int k = 0; k < nnow; k++) printf(" %d", now[k]);
  printf(" failed; the planner re-plans for the %d survivors:\n", fr->world0 - fr->nfailed);
  return true;
}

/* the survivors' plan's ranks on their GPUs: survivor i (the old program's i-th rank not lost)
 * is rank r of the new one where GPU nphys[r] ran it; survivors no rank names are idle (a replica
 * dropped). 0; 1 when this process's rank is idle; -1 with err. */
static int survivors_placed(ntp_exec *e, const ntp_program *old, const int32_t *phys, const bool *lost,
                            const ntp_program *np, const int32_t *nphys, ntp_exec_survivors *sv, char *err, size_t cap) {
  int32_t *from = malloc(((size_t)np->world + 1) * sizeof *from), *index = malloc(4096 * sizeof *index);
  int rc = from && index ? 0 : -1;
  for (int32_t g = 0; rc == 0 && g < 4096; g++) index[g] = -1;
  for (int32_t r = 0, i = 0; rc == 0 && r < old->world; r++)
    if (!lost[r]) index[phys ? phys[r] : r] = i++;
  for (int32_t r = 0; rc == 0 && r < np->world; r++)
    if ((from[r] = index[nphys[r]]) < 0) rc = -1, snprintf(err, cap, "internal: GPU %d of the survivors' plan did not survive", nphys[r]);
  if (rc == 0) rc = ntp_exec_survivors_order(e, sv, np->world, from, err, cap);
  free(from);
  free(index);
  return rc;
}

/* what the backend did to let the failed ranks go, and where this process's rank went */
static bool survivors_agree(const failover_run *fr, const ntp_exec_survivors *sv, const ntp_program *np,
                            const int32_t *nphys, char *err, size_t cap) {
  if (sv->n != np->world || (sv->local >= 0 && nphys[sv->local] != fr->phys_rank)) {
    snprintf(err, cap, "internal: %d survivors for a program of %d ranks%s", sv->n, np->world,
             sv->local >= 0 ? ", or this process's rank is not on its GPU" : "");
    return false;
  }
  if (sv->report[0] && sv->local >= 0)
    printf("  %s; this process (GPU %d) is rank %d of them\n", sv->report, fr->phys_rank, sv->local);
  else if (sv->report[0])
    printf("  %s\n", sv->report);
  return true;
}

/* the GPUs whose state no longer can be read: the failed ones, and with one rank per process the
 * idle ones too (their processes stopped: survivors_placed); dead[] extended in place */
static const bool *gone_too(const failover_run *fr, bool *dead, const ntp_program *np, const int32_t *nphys) {
  if (fr->phys_rank < 0) return dead; /* every rank here: an idle GPU's slices are still readable */
  bool used[4096] = {false};
  for (int32_t r = 0; r < np->world; r++) used[nphys[r]] = true;
  for (int32_t g = 0; g < fr->world0 && g < 4096; g++) dead[g] |= !used[g];
  return dead;
}

/* the state the survivors could not take from a replica: from the checkpoint, or the run ends */
static int back_to_checkpoint(const failover_run *fr, int nnow, int64_t missing, ntp_trainer *ntr, ntp_tokens *data,
                              char *err, size_t cap) {
  if (!fr->ckpt) {
    snprintf(err, cap, "the only copies of %lld elements of the training state were on the failed GPU%s, and there "
             "is no checkpoint to fall back on (--checkpoint DIR)", (long long)missing, nnow > 1 ? "s" : "");
    return -1;
  }
  if (ntp_checkpoint_load(fr->ckpt, ntr, data, err, cap) != 0) return -1;
  printf("  the only copies of %lld elements were on the failed GPU: back to the checkpoint of step %lld (%s)\n",
         (long long)missing, (long long)ntp_trainer_steps_taken(ntr), fr->ckpt);
  return 0;
}

int train_fail_over(failover_run *fr, long step, const int32_t *now, int nnow, ntp_program **prog, ntp_trainer **tr,
                    int32_t **phys, const ntp_adamw *aw, ntp_tokens *data, char *err, size_t cap) {
  if (!note_failed(fr, step, now, nnow, err, cap)) return -1;
  bool dead[4096] = {false}, lost[4096] = {false}; /* by physical GPU; by the failed run's rank */
  for (int32_t j = 0; j < fr->nfailed; j++) dead[fr->failed[j]] = true;
  for (int32_t r = 0; r < (*prog)->world; r++) lost[r] = dead[*phys ? (*phys)[r] : r];
  double t0 = train_now_s();
  int32_t *nphys = NULL;
  ntp_trainer *ntr = NULL;
  ntp_program *np = NULL;
  ntp_exec_survivors sv;
  if (ntp_exec_lose(ntp_trainer_exec(*tr), lost, (*prog)->world, &sv, err, cap) != 0) return -1;
  int64_t moved = 0, missing = 0;
  replan_ask ask = {.failed = fr->failed, .nfailed = fr->nfailed, .slow = fr->slow_known};
  int placed = (np = train_replan(&fr->src, fr->world0, &ask, &nphys, err, cap))
                   ? survivors_placed(ntp_trainer_exec(*tr), *prog, *phys, lost, np, nphys, &sv, err, cap) : -1;
  if (placed == 1) { /* this process's GPU is left out (its replica dropped): its work is done */
    printf("  GPU %d is idle in the survivors' plan (its pipeline replica dropped): this process stops here\n",
           fr->phys_rank);
    fr->idle = true;
    ntp_exec_survivors_free(&sv);
    ntp_program_free(np);
    free(nphys);
    return 0;
  }
  if (placed != 0 || !survivors_agree(fr, &sv, np, nphys, err, cap) ||
      ntp_trainer_new(np, aw, fr->seed, NULL, &sv.next, &ntr, err, cap) != 0 ||
      ntp_trainer_take_state(ntr, *tr, *phys, nphys, gone_too(fr, dead, np, nphys), &moved, &missing, err, cap) != 0 ||
      (missing && back_to_checkpoint(fr, nnow, missing, ntr, data, err, cap) != 0))
    goto fail;
  if (!missing && fr->phys_rank >= 0)
    printf("  resumed on %d GPUs in %.3f s (%.3f s after NCCL reported the lost peer): %.1f KiB of parameters and "
           "optimizer state moved from the surviving replicas, by NCCL send/recv between the survivors' "
           "processes (no checkpoint read)\n", np->world, train_now_s() - t0, train_now_s() - fr->detected, (double)moved / 1024.0);
  else if (!missing)
    printf("  resumed on %d GPUs in %.3f s: %.1f KiB of parameters and optimizer state moved from the surviving "
           "replicas (no checkpoint read)\n", np->world, train_now_s() - t0, (double)moved / 1024.0);
  ntp_trainer_free(*tr); /* nothing on the failed GPUs is touched (ntp_exec_lose) */
  ntp_exec_survivors_free(&sv);
  fr->keep[fr->nkeep++] = *prog;
  free(*phys);
  *tr = ntr;
  *prog = np;
  *phys = nphys;
  return 0;
fail:
  ntp_trainer_free(ntr);
  ntp_exec_survivors_free(&sv);
  ntp_program_free(np);
  free(nphys);
  return -1;
}

/* the healthy plan's own program (every failed GPU back): the source compiled as at the start */
static ntp_program *healthy_program(const train_source *src, int32_t world, int32_t **phys, char *err, size_t cap) {
  ntpc_session *s = train_session(src, true, world, src->plan_file, src->plan_name, NULL, err, cap);
  ntp_program *p = s ? session_program(s, err, cap) : NULL;
  ntpc_session_free(s);
  if (p && !(*phys = malloc((size_t)world * sizeof **phys))) {
    ntp_program_free(p);
    return snprintf(err, cap, "out of memory"), NULL;
  }
  for (int32_t r = 0; p && r < world; r++) (*phys)[r] = r;
  if (p) printf("    the healthy plan (%s), every GPU back\n", src->plan_file ? src->plan_file : "--world");
  return p;
}

int train_rejoin(failover_run *fr, long step, const int32_t *now, int nnow, ntp_program **prog, ntp_trainer **tr,
                 int32_t **phys, const ntp_adamw *aw, char *err, size_t cap) {
  for (int k = 0; k < nnow; k++) {
    int32_t at = -1;
    for (int32_t j = 0; j < fr->nfailed; j++)
      if (fr->failed[j] == now[k]) at = j;
    if (at < 0) return snprintf(err, cap, "--join-at %ld:%d: GPU %d is not down", step, now[k], now[k]), -1;
    fr->failed[at] = fr->failed[--fr->nfailed];
  }
  printf("step %4ld: GPU", step);
  for (int k = 0; k < nnow; k++) printf(" %d", now[k]);
  printf(" back, repaired; the planner re-plans for the %d GPUs:\n", fr->world0 - fr->nfailed);
  double t0 = train_now_s();
  int32_t *nphys = NULL;
  /* a straggler absorbed before: the stages cut around it (a staged plan; a flat one goes back to
   * its healthy plan, the straggler no longer re-split) */
  replan_ask ask = {.failed = fr->failed, .nfailed = fr->nfailed, .slow = fr->slow_known};
  ntp_program *np = fr->nfailed || fr->slow_known ? train_replan(&fr->src, fr->world0, &ask, &nphys, err, cap)
                                                  : healthy_program(&fr->src, fr->world0, &nphys, err, cap);
  if (!np) return -1;
  int *devs = malloc((size_t)np->world * sizeof *devs); /* rank r on its physical GPU */
  int32_t *from = malloc((size_t)np->world * sizeof *from); /* ... and the running rank it was, or -1 */
  for (int32_t r = 0; devs && from && r < np->world; r++) {
    devs[r] = nphys[r], from[r] = -1;
    for (int32_t o = 0; o < (*prog)->world; o++)
      if ((*phys ? (*phys)[o] : o) == nphys[r]) from[r] = o;
  }
  /* backends with devices put rank r on its physical GPU (the others read no device field); NCCL
   * grows the running world by the repaired GPUs' ranks where it can (ncclCommGrow), else the next
   * executor makes its world afresh */
  ntp_exec_options x = {.backend = fr->backend, .loopback = fr->loopback, .devices = fr->loopback ? NULL : devs};
  ntp_exec_survivors sv = {0};
  int g = devs && from ? ntp_exec_grow(ntp_trainer_exec(*tr), np->world, from, devs, &sv, err, cap) : -1;
  if (g == 0) x = sv.next;
  if (g >= 0 && sv.report[0]) printf("  %s\n", sv.report); /* grown, or why the world is made afresh */
  int64_t moved = 0;
  int rc = g >= 0 ? train_switch(fr, np, nphys, &x, aw, prog, tr, phys, &moved, err, cap)
                  : (ntp_program_free(np), free(nphys), err[0] ? 0 : snprintf(err, cap, "out of memory"), -1);
  ntp_exec_survivors_free(&sv);
  free(devs);
  free(from);
  if (rc == 0)
    printf("  resumed on %d GPUs in %.3f s: %.1f KiB of parameters and optimizer state handed to the new plan's "
           "slices from the ranks that hold them (no checkpoint read)\n", (*prog)->world, train_now_s() - t0,
           (double)moved / 1024.0);
  return rc;
}

int train_switch(failover_run *fr, ntp_program *np, int32_t *nphys, const ntp_exec_options *x, const ntp_adamw *aw,
                 ntp_program **prog, ntp_trainer **tr, int32_t **phys, int64_t *moved, char *err, size_t cap) {
  bool dead[4096] = {false};
  for (int32_t j = 0; j < fr->nfailed; j++) dead[fr->failed[j]] = true;
  ntp_trainer *ntr = NULL;
  int64_t missing = 0;
  if (fr->nkeep == (int)(sizeof fr->keep / sizeof *fr->keep)) {
    snprintf(err, cap, "more than %d re-plans in one run", fr->nkeep);
  } else if (ntp_trainer_new(np, aw, fr->seed, NULL, x, &ntr, err, cap) == 0 &&
             ntp_trainer_take_state(ntr, *tr, *phys, nphys, dead, moved, &missing, err, cap) == 0) {
    if (!missing) {
      ntp_trainer_free(*tr);
      fr->keep[fr->nkeep++] = *prog;
      free(*phys);
      *tr = ntr, *prog = np, *phys = nphys;
      return 0;
    }
    snprintf(err, cap, "internal: %lld elements have no copy though no GPU holding them failed", (long long)missing);
  }
  ntp_trainer_free(ntr);
  ntp_program_free(np);
  free(nphys);
  return -1;
}

void failover_run_free(failover_run *fr) {
  for (int k = 0; k < fr->nkeep; k++) ntp_program_free(fr->keep[k]);
  fr->nkeep = 0;
  free(fr->slow_known);
  fr->slow_known = NULL;
}
