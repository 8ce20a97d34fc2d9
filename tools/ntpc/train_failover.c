/* train_failover.c — `ntpc train --fail-at`: the survivors' training program after GPUs fail.
 * The planner re-plans from the healthy plan with the failed GPUs removed (plan_failover_solve,
 * what `ntpc plan --fail` prints), the plan is written to a temporary file and the model compiled
 * under it with its gradient pass, as `ntpc train --plan` would. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "planner.h"
#include "session_program.h"
#include "train_failover.h"

static ntpc_session *session(const train_source *src, bool grad, int32_t world, const char *plan_file,
                             const char *plan_name, char *err, size_t cap) {
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
  ntpc_want_grad(s, grad);
  ntpc_want_cuda(s, grad && src->cuda);
  if (ntpc_compile_file(s, src->file) != NTPC_OK) {
    const ntpc_diag *d = ntpc_diag_count(s) ? ntpc_diag_at(s, 0) : NULL;
    snprintf(err, cap, "the survivors' plan does not compile: %s", d ? d->message : ntpc_last_error(s));
    ntpc_session_free(s);
    return NULL;
  }
  return s;
}

ntp_program *train_replan(const train_source *src, int32_t world, const int32_t *failed, int32_t nfailed,
                          int32_t **phys, char *err, size_t cap) {
  *phys = NULL;
  ntp_program *prog = NULL;
  plan_model *pm = NULL;
  plan_failover f;
  bool solved = false;
  char path[] = "/tmp/ntp-survivors-XXXXXX";
  int fd = -1;
  ntpc_session *healthy = session(src, false, world, src->plan_file, src->plan_name, err, cap), *next = NULL;
  if (!healthy) return NULL;
  const ir_module *m = ntpc_module(healthy);
  if (!(pm = plan_model_new(m, ntpc_diag_sink(healthy)))) {
    snprintf(err, cap, "the planner cannot read the model");
    goto done;
  }
  plan_profile prof;
  plan_profile_builtin("h100", &prof);
  plan_request rq = {.world = world, .prof = &prof, .failed = failed, .nfailed = nfailed, .train = true};
  if (!(solved = plan_failover_solve(pm, m, &rq, &f, ntpc_diag_sink(healthy))) || !f.survivors.feasible) {
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
  plan_write_plan(out, pm, m, &f.survivors, "survivors", "the survivors' plan (ntpc train --fail-at)");
  if (fclose(out) != 0) {
    snprintf(err, cap, "cannot write the survivors' plan to %s", path);
    goto done;
  }
  if (!(next = session(src, true, f.survivors.world, path, "survivors", err, cap))) goto done;
  if (!(prog = session_program(next, err, cap))) goto done;
  if (!(*phys = malloc((size_t)f.survivors.world * sizeof **phys))) {
    ntp_program_free(prog);
    prog = NULL;
    snprintf(err, cap, "out of memory");
    goto done;
  }
  memcpy(*phys, f.survivors.phys, (size_t)f.survivors.world * sizeof **phys);
  FILE *in = fopen(path, "r"); /* the plan, for the log */
  char line[512];
  while (in && fgets(line, sizeof line, in))
    if (line[0] == ' ' && strchr(line, ';')) printf("  %s", line);
  if (in) fclose(in);
done:
  if (fd >= 0) close(fd);
  unlink(path);
  if (solved) plan_failover_free(&f);
  plan_model_free(pm);
  ntpc_session_free(next);
  ntpc_session_free(healthy);
  return prog;
}
