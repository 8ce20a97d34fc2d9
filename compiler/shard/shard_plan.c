/* shard_plan.c — from inline @tp annotations and the active plan to one placement per
 * layer: the world size, TP groups (equal or not), sequence parallelism, batch shares. */
#include <string.h>

#include "shard.h"
#include "shard_internal.h"

typedef struct placement_ctx {
  diag_sink *diags;
} placement_ctx;

/* One report per annotation or rule, however many (repeated) layers it covers. */
static void place_report(placement_ctx *c, ntpc_severity sev, const char *file, ntp_loc loc, const char *fmt,
                         long long a, long long b) {
  for (size_t i = 0; i < c->diags->len; i++) {
    const ntpc_diag *d = &c->diags->items[i];
    if (d->line == loc.first_line && d->col == loc.first_column && d->file == file) return;
  }
  diag_emit(c->diags, sev, file, loc, fmt, a, b);
}

static void place_error(placement_ctx *c, const char *file, ntp_loc loc, const char *fmt, long long a, long long b) {
  place_report(c, NTPC_ERROR, file, loc, fmt, a, b);
}

bool shard_place(const ir_module *m, int32_t world_opt, int32_t *world, sh_placement *out, diag_sink *diags) {
  placement_ctx ctx = {diags}, *c = &ctx;
  const ir_plan *plan = m->active_plan >= 0 ? &m->plans[m->active_plan] : NULL;
  size_t errors = c->diags->errors;

  int32_t W = world_opt > 0 ? world_opt : 1;
  if (plan && plan->world) {
    if (world_opt > 0 && world_opt != plan->world)
      place_error(c, plan->file, plan->loc, "plan sets world %lld, but --world is %lld", (long long)plan->world,
                  (long long)world_opt);
    W = (int32_t)plan->world;
  }
  *world = W;

  for (size_t l = 0; l < m->n_layers; l++) {
    const ir_layer *ly = &m->layers[l];
    sh_placement *pl = &out[l];
    *pl = (sh_placement){.rule = -1};
    ir_tp tp = ly->tp;
    const char *file = m->file;
    int best = -1;
    const ir_rule *rule = NULL;
    for (size_t r = 0; plan && r < plan->nrules; r++) {
      if (!ir_glob_match(plan->rules[r].pattern, ly->name)) continue;
      int spec = ir_pattern_specificity(plan->rules[r].pattern);
      if (spec >= best) { /* more specific wins; among equals, the later */
        best = spec;
        rule = &plan->rules[r];
        pl->rule = (int32_t)r;
      }
    }
    if (rule) {
      tp = rule->tp;
      file = plan->file;
      pl->seq_parallel = rule->seq_parallel;
      pl->recompute = rule->recompute;
    }
    /* With one rank every layer runs whole; inline annotations are defaults for larger worlds. */
    if (W == 1 && !rule) tp = (ir_tp){.kind = TP_NONE};

    int64_t groups[NTP_MAX_GROUPS];
    int ng = 0;
    pl->tp_file = file;
    pl->tp_loc = tp.loc.first_line ? tp.loc : rule ? rule->loc : ly->loc;
    if (tp.kind == TP_AUTO) {
      pl->is_auto = W > 1; /* the planner's (with one rank there is nothing to choose) */
      groups[ng++] = W;
    } else if (tp.kind == TP_NONE || (tp.kind == TP_DEGREES && tp.n == 1)) {
      int64_t t = tp.kind == TP_NONE ? 1 : tp.groups[0];
      if (t > W) {
        place_error(c, file, tp.loc, "TP degree %lld is larger than the world (%lld ranks)", t, W);
        t = W;
      } else if (W % t) {
        diag_emit(c->diags, NTPC_ERROR, file, tp.loc,
                  "TP degree %lld does not divide the world (%d ranks); give unequal groups, as in tp (%lld, %lld)",
                  (long long)t, W, (long long)t, (long long)(W - t));
        t = 1;
      }
      for (int64_t g = 0; g < W / t && ng < NTP_MAX_GROUPS; g++) groups[ng++] = t;
      if (W / t > NTP_MAX_GROUPS) {
        place_error(c, file, tp.loc, "%lld groups: at most %lld are supported", (long long)(W / t), NTP_MAX_GROUPS);
      }
    } else {
      int64_t sum = 0;
      for (int i = 0; i < tp.n; i++) sum += groups[ng++] = tp.groups[i];
      if (sum != W) {
        place_error(c, file, tp.loc, "groups sum to %lld ranks, but the world has %lld", sum, W);
        ng = 0;
        groups[ng++] = W;
      }
    }
    pl->ngroups = ng;
    pl->group_start[0] = 0;
    for (int g = 0; g < ng; g++) pl->group_start[g + 1] = pl->group_start[g] + (int32_t)groups[g];
    /* batch shares: explicit, or proportional to group size (equal work per GPU) */
    for (int g = 0; g < ng; g++) pl->share[g] = groups[g];
    if (rule && rule->nbatch && pl->is_auto) /* the planner chooses a 'tp auto' layer's shares with its groups */
      place_report(c, NTPC_WARNING, file, rule->loc, "batch shares are ignored with 'tp auto': the planner chooses them",
                   0, 0);
    if (rule && rule->nbatch && !pl->is_auto) {
      if (rule->nbatch != ng) {
        place_error(c, file, rule->loc, "batch split has %lld shares but the layer has %lld groups",
                    (long long)rule->nbatch, ng);
      } else {
        for (int g = 0; g < ng; g++) pl->share[g] = rule->batch[g];
        pl->shares_given = true;
      }
    }
  }
  return c->diags->errors == errors;
}

bool sh_verify_placements(const ir_module *m, int32_t world, const sh_placement *pls, char *err, size_t cap) {
  for (size_t l = 0; l < m->n_layers; l++) {
    const sh_placement *pl = &pls[l];
    const char *name = m->layers[l].name;
    if (pl->ngroups < 1 || pl->ngroups > NTP_MAX_GROUPS || pl->group_start[0] != 0 ||
        pl->group_start[pl->ngroups] != world)
      return ir_fail(err, cap, "layer '%s': its %d groups do not cover the %d ranks", name, pl->ngroups, world);
    for (int g = 0; g < pl->ngroups; g++) {
      if (pl->group_start[g + 1] <= pl->group_start[g])
        return ir_fail(err, cap, "layer '%s': group %d is empty", name, g);
      if (pl->share[g] < 0) return ir_fail(err, cap, "layer '%s': group %d has a negative batch share", name, g);
    }
  }
  return true;
}

/* Rows per group in proportion to the shares, largest remainders first; sums to rows. */
void shard_split_rows(int64_t rows, const int64_t *shares, int32_t ngroups, int64_t *row_start) {
  int64_t total = 0, given = 0, take[NTP_MAX_GROUPS], rem[NTP_MAX_GROUPS];
  bool bumped[NTP_MAX_GROUPS] = {0};
  for (int g = 0; g < ngroups; g++) total += shares[g];
  for (int g = 0; g < ngroups; g++) {
    given += take[g] = rows * shares[g] / total;
    rem[g] = rows * shares[g] % total;
  }
  while (given < rows) {
    int best = -1;
    for (int g = 0; g < ngroups; g++)
      if (!bumped[g] && (best < 0 || rem[g] > rem[best])) best = g;
    take[best]++;
    bumped[best] = true;
    given++;
  }
  row_start[0] = 0;
  for (int g = 0; g < ngroups; g++) row_start[g + 1] = row_start[g] + take[g];
}
