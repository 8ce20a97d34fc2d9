/* autoplan.c — the autoplan pass: a layer whose placement is 'tp auto' gets the planner's choice
 * (docs/planner.md) for the session's device profile, with every other layer pinned as written;
 * `run`, `check`, `report` and `-o` resolve 'tp auto' this way, as `ntpc plan` does. */
#include <stdlib.h>
#include <string.h>

#include "autoplan.h"
#include "planner.h"

static void append(char **buf, size_t *len, const char *line) {
  size_t n = strlen(line);
  char *nb = realloc(*buf, *len + n + 2);
  if (!nb) return;
  memcpy(nb + *len, line, n);
  nb[*len + n] = '\n';
  nb[*len + n + 1] = 0;
  *buf = nb;
  *len += n + 1;
}

bool autoplan_resolve(const ir_module *m, int32_t world, sh_placement *pls, const char *gpu, diag_sink *diags,
                      char **notes) {
  *notes = NULL;
  int32_t first = -1;
  for (size_t l = 0; l < m->n_layers && first < 0; l++)
    if (pls[l].is_auto) first = (int32_t)l;
  if (first < 0) return true;
  const sh_placement *fa = &pls[first];
  plan_profile prof;
  const char *g = gpu ? gpu : "h100";
  char why[512];
  if (!plan_profile_find(g, &prof, why, sizeof why)) {
    diag_emit(diags, NTPC_ERROR, fa->tp_file, fa->tp_loc, "'tp auto' is planned for a GPU profile: %s", why);
    return false;
  }
  size_t errors = diags->errors;
  plan_model *pm = plan_model_new(m, diags);
  plan_request rq = {.world = world, .prof = &prof, .fixed = pls};
  plan_solution sol = {0};
  bool ok = pm && plan_solve(pm, m, &rq, &sol, diags);
  if (!ok || !sol.feasible) {
    if (ok)
      diag_emit(diags, NTPC_ERROR, fa->tp_file, fa->tp_loc, "'tp auto' (layer '%s'): no placement fits %d x %s: %s",
                m->layers[first].name, world, prof.device, sol.why);
    else if (diags->errors > errors) /* the planner's own errors, located: say who asked */
      diag_emit(diags, NTPC_NOTE, fa->tp_file, fa->tp_loc, "'tp auto' (layer '%s') asks the planner to choose",
                m->layers[first].name);
    if (ok) plan_solution_free(&sol);
    plan_model_free(pm);
    return false;
  }
  /* the choices, and one note per 'tp auto' and placement chosen for it */
  int32_t n = plan_model_layers(pm);
  bool *was_auto = calloc(m->n_layers + 1, sizeof *was_auto);
  char **chosen = calloc(m->n_layers + 1, sizeof *chosen);
  sh_placement *planned = calloc(m->n_layers + 1, sizeof *planned);
  size_t len = 0;
  ok = was_auto && chosen && planned;
  if (ok) plan_solution_placements(pm, &sol, planned);
  for (int32_t i = 0; ok && i < n; i++) {
    int32_t l = plan_model_ir_layer(pm, i);
    if (!pls[l].is_auto) continue;
    char buf[512];
    plan_place_str(&sol.layers[i].place, buf, sizeof buf);
    chosen[l] = strdup(buf);
    was_auto[l] = true;
    sh_placement keep = pls[l]; /* where the 'tp auto' was written, for the note */
    pls[l] = planned[l];
    pls[l].rule = keep.rule;
    pls[l].tp_file = keep.tp_file;
    pls[l].tp_loc = keep.tp_loc;
  }
  for (size_t l = 0; ok && l < m->n_layers; l++) {
    if (pls[l].is_auto) { /* not in the planner's chain (a norm): it follows its input */
      pls[l].is_auto = false;
      continue;
    }
    if (!was_auto[l] || !chosen[l]) continue;
    /* every layer with the same 'tp auto' and the same choice: one note */
    int count = 0;
    const char *last = NULL;
    for (size_t k = l; k < m->n_layers; k++) {
      if (!was_auto[k] || !chosen[k] || strcmp(chosen[k], chosen[l]) || pls[k].tp_loc.first_line != pls[l].tp_loc.first_line ||
          pls[k].tp_loc.first_column != pls[l].tp_loc.first_column || pls[k].tp_file != pls[l].tp_file)
        continue;
      count++;
      last = m->layers[k].name;
      if (k != l) {
        free(chosen[k]);
        chosen[k] = NULL;
      }
    }
    char line[1024];
    if (count > 1)
      snprintf(line, sizeof line, "'tp auto': the planner chose %s for %d layers ('%s' to '%s') on %d x %s",
               chosen[l], count, m->layers[l].name, last, world, prof.device);
    else
      snprintf(line, sizeof line, "'tp auto': the planner chose %s for '%s' on %d x %s", chosen[l], m->layers[l].name,
               world, prof.device);
    diag_emit(diags, NTPC_NOTE, pls[l].tp_file, pls[l].tp_loc, "%s", line);
    append(notes, &len, line);
  }
  for (size_t l = 0; chosen && l < m->n_layers; l++) free(chosen[l]);
  free(chosen);
  free(was_auto);
  free(planned);
  plan_solution_free(&sol);
  plan_model_free(pm);
  return ok;
}
