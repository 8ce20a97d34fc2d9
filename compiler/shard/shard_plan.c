/* shard_plan.c — from inline @tp annotations and the active plan to one placement per
 * layer: the world size, TP groups (equal or not), sequence parallelism, batch shares. */
#include <stdarg.h>
#include <string.h>

#include "shard.h"
#include "shard_internal.h"

typedef struct placement_ctx {
  diag_sink *diags;
} placement_ctx;

/* One report per annotation or rule, however many (repeated) layers it covers. */
static void place_vreport(placement_ctx *c, ntpc_severity sev, const char *file, ntp_loc loc, const char *fmt,
                          va_list ap) {
  for (size_t i = 0; i < c->diags->len; i++) {
    const ntpc_diag *d = &c->diags->items[i];
    if (d->line == loc.first_line && d->col == loc.first_column && d->file == file) return;
  }
  diag_vemit(c->diags, sev, file, loc, fmt, ap);
}

__attribute__((format(printf, 5, 6))) static void place_report(placement_ctx *c, ntpc_severity sev, const char *file,
                                                               ntp_loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  place_vreport(c, sev, file, loc, fmt, ap);
  va_end(ap);
}

__attribute__((format(printf, 4, 5))) static void place_error(placement_ctx *c, const char *file, ntp_loc loc,
                                                              const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  place_vreport(c, NTPC_ERROR, file, loc, fmt, ap);
  va_end(ap);
}

/* The groups of a TP spec over n ranks (the world, or a stage's ranks: `stage` names them for
 * messages). Returns how many; on an error reported, one group of all n. */
static int span_groups(placement_ctx *c, ir_tp tp, int32_t n, const char *file, const char *stage, int64_t *groups,
                       bool *is_auto) {
  int ng = 0;
  char span[160];
  if (stage) snprintf(span, sizeof span, "the %d rank%s of %s", n, n == 1 ? "" : "s", stage);
  else snprintf(span, sizeof span, "%d ranks", n);
  if (tp.kind == TP_AUTO) {
    *is_auto = n > 1; /* the planner's (with one rank there is nothing to choose) */
    groups[ng++] = n;
  } else if (tp.kind == TP_NONE || (tp.kind == TP_DEGREES && tp.n == 1)) {
    int64_t t = tp.kind == TP_NONE ? 1 : tp.groups[0];
    if (t > n) {
      if (stage) place_error(c, file, tp.loc, "TP degree %lld is larger than %s", (long long)t, span);
      else place_error(c, file, tp.loc, "TP degree %lld is larger than the world (%s)", (long long)t, span);
      t = n;
    } else if (n % t) {
      if (stage)
        place_error(c, file, tp.loc, "TP degree %lld does not divide %s; give unequal groups, as in tp (%lld, %lld)",
                    (long long)t, span, (long long)t, (long long)(n - t));
      else /* every layer it covers, as before stages */
        diag_emit(c->diags, NTPC_ERROR, file, tp.loc,
                  "TP degree %lld does not divide the world (%s); give unequal groups, as in tp (%lld, %lld)",
                  (long long)t, span, (long long)t, (long long)(n - t));
      t = 1;
    }
    for (int64_t g = 0; g < n / t && ng < NTP_MAX_GROUPS; g++) groups[ng++] = t;
    if (n / t > NTP_MAX_GROUPS)
      place_error(c, file, tp.loc, "%lld groups: at most %d are supported", (long long)(n / t), NTP_MAX_GROUPS);
  } else {
    int64_t sum = 0;
    for (int i = 0; i < tp.n; i++) sum += groups[ng++] = tp.groups[i];
    if (sum != n) {
      if (stage) place_error(c, file, tp.loc, "groups sum to %lld ranks, not %s", (long long)sum, span);
      else place_error(c, file, tp.loc, "groups sum to %lld ranks, but the world has %d", (long long)sum, n);
      ng = 0;
      groups[ng++] = n;
    }
  }
  return ng;
}

/* Batch shares of groups [g0, g0 + k): explicit, or in proportion to group size (equal work per GPU). */
static void place_shares(placement_ctx *c, sh_placement *pl, const ir_rule *rule, const char *file, int g0, int k) {
  for (int g = g0; g < g0 + k; g++) pl->share[g] = sh_group_size(pl, g);
  if (rule && rule->nbatch && pl->is_auto) /* the planner chooses a 'tp auto' layer's shares with its groups */
    place_report(c, NTPC_WARNING, file, rule->loc, "batch shares are ignored with 'tp auto': the planner chooses them");
  if (rule && rule->nbatch && !pl->is_auto) {
    if (rule->nbatch != k) {
      place_error(c, file, rule->loc, "batch split has %d shares but the layer has %d groups", rule->nbatch, k);
    } else {
      for (int g = 0; g < k; g++) pl->share[g0 + g] = rule->batch[g];
      pl->shares_given = true;
    }
  }
}

/* The most specific rule written inside pipeline block `pi` for the layer, or NULL. Its groups and
 * batch shares are that pipeline's; sequence parallelism and recomputation are the layer's, so
 * they must agree with the rule that sets them for every pipeline. */
static const ir_rule *pipe_rule(placement_ctx *c, const ir_plan *plan, const char *layer, int32_t pi,
                                const sh_placement *pl, const ir_rule *global) {
  const ir_rule *own = NULL;
  int best = -1;
  for (size_t r = 0; plan && r < plan->nrules; r++) {
    const ir_rule *x = &plan->rules[r];
    if (x->pipe != pi || !ir_glob_match(x->pattern, layer)) continue;
    int spec = ir_pattern_specificity(x->pattern);
    if (spec >= best) best = spec, own = x;
  }
  if (own && (own->seq_parallel != pl->seq_parallel || own->recompute != pl->recompute))
    place_error(c, plan->file, own->loc,
                "sequence_parallel and recompute are the layer's, not a pipeline's: a rule inside a pipeline block "
                "must say them as %s does for '%s'", global ? "the plan's rule for every pipeline" : "the layer's default",
                layer);
  return own;
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
  sh_pipes pipes;
  if (!shard_resolve_pipes(m, W, &pipes, c->diags)) return false;

  for (size_t l = 0; l < m->n_layers; l++) {
    const ir_layer *ly = &m->layers[l];
    sh_placement *pl = &out[l];
    *pl = (sh_placement){.rule = -1};
    ir_tp tp = ly->tp;
    const char *file = m->file;
    int best = -1;
    const ir_rule *rule = NULL;
    for (size_t r = 0; plan && r < plan->nrules; r++) {
      if (plan->rules[r].pipe >= 0 || !ir_glob_match(plan->rules[r].pattern, ly->name)) continue;
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

    pl->tp_file = file;
    pl->tp_loc = tp.loc.first_line ? tp.loc : rule ? rule->loc : ly->loc;
    if (tp.kind == TP_AUTO && pipes.npipes) {
      place_error(c, file, pl->tp_loc, "'tp auto' with pipeline stages: the planner does not place stages yet; give a degree");
      tp = (ir_tp){.kind = TP_NONE};
    }
    if (!pipes.npipes) {
      int64_t groups[NTP_MAX_GROUPS];
      int ng = span_groups(c, tp, W, file, NULL, groups, &pl->is_auto);
      sh_placement_set_groups(pl, groups, ng);
      place_shares(c, pl, rule, file, 0, ng);
      continue;
    }
    pl->npipes = pipes.npipes;
    int ng = 0;
    for (int32_t pi = 0; pi < pipes.npipes; pi++) {
      const sh_pipeline *pp = &pipes.pipe[pi];
      int32_t ch = sh_pipe_chunk(pp, (int32_t)l);
      const sh_stage *st = &pp->stages[ch];
      int32_t n = st->rank_hi - st->rank_lo;
      char where[96];
      if (pipes.npipes > 1)
        snprintf(where, sizeof where, "stage %d of pipeline %d (ranks %d..%d)", ch, pi, st->rank_lo, st->rank_hi - 1);
      else snprintf(where, sizeof where, "stage %d (ranks %d..%d)", ch, st->rank_lo, st->rank_hi - 1);
      int64_t groups[NTP_MAX_GROUPS];
      bool dummy;
      const ir_rule *own = pipe_rule(c, plan, ly->name, pi, pl, rule); /* a rule of this pipeline alone */
      int k = span_groups(c, own ? own->tp : tp, n, own ? plan->file : file, where, groups, &dummy);
      if (ng + k > NTP_MAX_GROUPS) {
        place_error(c, file, pl->tp_loc, "%d groups: at most %d are supported", ng + k, NTP_MAX_GROUPS);
        break;
      }
      int32_t at = st->rank_lo;
      for (int g = 0; g < k; g++) {
        pl->group_start[ng + g] = at;
        pl->group_end[ng + g] = at += (int32_t)groups[g];
        pl->group_pipe[ng + g] = pi;
      }
      pl->chunk[pi] = ch;
      pl->pipe_share[pi] = pp->share;
      pl->ngroups = ng + k;
      place_shares(c, pl, own ? own : rule, own ? plan->file : file, ng, k);
      ng += k;
    }
  }
  sh_pipes_free(&pipes);
  return c->diags->errors == errors;
}

void sh_placement_set_groups(sh_placement *pl, const int64_t *sizes, int32_t n) {
  pl->ngroups = n;
  pl->group_start[0] = 0;
  for (int g = 0; g < n; g++) {
    pl->group_start[g + 1] = pl->group_start[g] + (int32_t)sizes[g];
    pl->group_end[g] = pl->group_start[g + 1];
    pl->group_pipe[g] = 0;
  }
}

bool sh_verify_placements(const ir_module *m, int32_t world, const sh_placement *pls, char *err, size_t cap) {
  for (size_t l = 0; l < m->n_layers; l++) {
    const sh_placement *pl = &pls[l];
    const char *name = m->layers[l].name;
    if (pl->ngroups < 1 || pl->ngroups > NTP_MAX_GROUPS)
      return ir_fail(err, cap, "layer '%s': %d groups", name, pl->ngroups);
    int64_t covered = 0;
    for (int g = 0; g < pl->ngroups; g++) {
      if (pl->group_end[g] <= pl->group_start[g]) return ir_fail(err, cap, "layer '%s': group %d is empty", name, g);
      if (pl->group_start[g] < 0 || pl->group_end[g] > world)
        return ir_fail(err, cap, "layer '%s': group %d is outside the %d ranks", name, g, world);
      for (int h = 0; h < g; h++)
        if (pl->group_start[h] < pl->group_end[g] && pl->group_start[g] < pl->group_end[h])
          return ir_fail(err, cap, "layer '%s': groups %d and %d share ranks", name, h, g);
      if (pl->share[g] < 0) return ir_fail(err, cap, "layer '%s': group %d has a negative batch share", name, g);
      if (pl->npipes && (pl->group_pipe[g] < 0 || pl->group_pipe[g] >= pl->npipes))
        return ir_fail(err, cap, "layer '%s': group %d is in no pipeline", name, g);
      covered += sh_group_size(pl, g);
    }
    if (!pl->npipes && covered != world)
      return ir_fail(err, cap, "layer '%s': its %d groups do not cover the %d ranks", name, pl->ngroups, world);
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
