/* sema_plans.c — plans: world, rules (degrees, groups, options), pipeline stages; checked
 * against the model's layers and lowered into the IR's plans. */
#include <stdlib.h>
#include <string.h>

#include "sema.h"

/* ---- plans ------------------------------------------------------------------ */

static bool lower_tp_list(sema *s, const ast_expr *list, ir_tp *tp, const char *what) {
  tp->kind = TP_DEGREES;
  tp->n = 0;
  for (const ast_expr *e = list; e; e = e->next) {
    int64_t d;
    if (!sema_eval_bounded(s, e, what, NTP_MAX_WORLD, &d)) return false;
    if (tp->n == NTP_MAX_GROUPS) {
      sema_error(s, e->loc, "at most %d groups", NTP_MAX_GROUPS);
      return false;
    }
    tp->groups[tp->n++] = d;
  }
  return true;
}

bool sema_lower_tp(sema *s, const ast_tp *in, ir_tp *out) {
  *out = (ir_tp){.loc = in->loc};
  if (in->is_auto) {
    out->kind = TP_AUTO;
    return true;
  }
  return lower_tp_list(s, in->degrees, out, "a TP degree");
}

static int64_t tp_world(const ir_tp *tp) {
  int64_t sum = 0; /* each group is at most NTP_MAX_WORLD: no overflow */
  for (int i = 0; i < tp->n; i++) sum += tp->groups[i];
  return sum;
}

/* A stage's layer names must each name a layer or be a dotted prefix of some (blk.6). */
static void check_stage_name(sema *s, const char *name, ntp_loc loc) {
  if (strchr(name, '*') || strchr(name, '{')) {
    sema_error(s, loc, "a stage names its first and last layers ('%s' is a pattern)", name);
    return;
  }
  if (ir_layer_by_prefix(s->m, name, false) < 0)
    sema_error(s, loc, "no layer of model '%s' is named '%s' or starts with '%s.'", s->m->name, name, name);
}

static void lower_stage(sema *s, const ast_pstmt *st, ir_pipeline *pipe, size_t *cap) {
  ir_stage g = {.first = st->pattern, .last = st->last, .first_loc = st->pattern_loc, .last_loc = st->last_loc,
                .ranks_loc = st->ranks_loc, .loc = st->loc};
  check_stage_name(s, g.first, g.first_loc);
  if (g.last != g.first) check_stage_name(s, g.last, g.last_loc);
  if (!sema_eval_bounded_from(s, st->rank_lo, "a rank", 0, NTP_MAX_WORLD - 1, &g.rank_lo) ||
      !sema_eval_bounded_from(s, st->rank_hi, "a rank", 0, NTP_MAX_WORLD - 1, &g.rank_hi))
    return;
  if (g.rank_hi < g.rank_lo) {
    sema_error(s, st->ranks_loc, "ranks %lld..%lld: the last rank comes before the first", (long long)g.rank_lo,
               (long long)g.rank_hi);
    return;
  }
  VEC_PUSH(pipe->stages, pipe->nstages, *cap, g);
}

/* 'optimizer zero Z [redundancy K] [domain D];': the distributed optimizer (docs/training.md). */
static void lower_optimizer(sema *s, const ast_pstmt *st, ir_plan *plan) {
  if (plan->zero_loc.first_line) {
    sema_error(s, st->loc, "'optimizer' is given twice in plan '%s'", plan->name);
    return;
  }
  plan->zero_loc = st->loc;
  bool has_zero = false, has_red = false, has_dom = false, zero_ok = false;
  for (const ast_arg *a = st->settings; a; a = a->next) {
    int64_t v;
    bool zero = strcmp(a->key, "zero") == 0, red = strcmp(a->key, "redundancy") == 0, dom = strcmp(a->key, "domain") == 0;
    if (!zero && !red && !dom) {
      sema_error(s, a->key_loc, "unknown optimizer setting '%s' (expected 'zero', 'redundancy' or 'domain')", a->key);
      continue;
    }
    if ((zero && has_zero) || (red && has_red) || (dom && has_dom)) {
      sema_error(s, a->key_loc, "'%s' is given twice", a->key);
      continue;
    }
    if (dom) {
      has_dom = true;
      if (sema_eval_bounded_from(s, a->value, "a failure domain's GPU count", 1, NTP_MAX_WORLD, &v))
        plan->domain_size = (int32_t)v;
    } else if (zero) {
      has_zero = true;
      if ((zero_ok = sema_eval_bounded_from(s, a->value, "a ZeRO stage", 0, 2, &v))) plan->zero = (int32_t)v;
    } else {
      has_red = true;
      if (sema_eval_bounded_from(s, a->value, "a redundancy", 1, 64, &v)) plan->redundancy = (int32_t)v;
    }
  }
  if (!has_zero) sema_error(s, st->loc, "'optimizer' needs 'zero 1' or 'zero 2' (or 'zero 0': every replica keeps all)");
  else if (has_red && zero_ok && plan->zero == 0)
    sema_error(s, st->loc, "'redundancy' shards the optimizer's state: it needs 'zero 1' or 'zero 2'");
  if (!plan->redundancy) plan->redundancy = 1;
}

/* A rule, `PATTERN tp SPEC [, OPTION]...;`, of every pipeline (pipe -1) or of one. false: skipped
 * (reported). */
static bool lower_rule(sema *s, const ast_pstmt *st, int32_t pipe, ir_rule *out) {
  ir_rule r = {.pattern = st->pattern, .seq_parallel = st->seq_parallel, .recompute = st->recompute, .pipe = pipe,
               .loc = st->loc};
  if (!sema_lower_tp(s, st->tp, &r.tp)) return false;
  if (st->batch) {
    ir_tp b;
    if (!lower_tp_list(s, st->batch, &b, "a batch share")) return false;
    r.nbatch = b.n;
    memcpy(r.batch, b.groups, sizeof b.groups);
    if (r.tp.kind == TP_DEGREES && r.tp.n > 1 && r.nbatch != r.tp.n)
      sema_error(s, st->batch_loc, "batch split has %d shares but the rule has %d groups", r.nbatch, r.tp.n);
  }
  bool matched = false;
  for (size_t l = 0; l < s->m->n_layers && !matched; l++) matched = ir_glob_match(r.pattern, s->m->layers[l].name);
  if (!matched) {
    const char **cands = malloc((s->m->n_layers + 1) * sizeof *cands);
    for (size_t l = 0; cands && l < s->m->n_layers; l++) cands[l] = s->m->layers[l].name;
    const char *near = cands ? nearest_name(r.pattern, cands, s->m->n_layers) : NULL;
    free(cands);
    if (near) sema_error(s, st->pattern_loc, "rule '%s' matches no layer of model '%s'; did you mean '%s'?", r.pattern,
                         s->m->name, near);
    else sema_error(s, st->pattern_loc, "rule '%s' matches no layer of model '%s'", r.pattern, s->m->name);
  }
  *out = r;
  return true;
}

void sema_lower_plan(sema *s, const ast_plan *p, bool active) {
  const char *saved = s->file;
  s->file = p->file;
  ir_plan plan = {.name = p->name, .model = p->model, .file = p->file, .loc = p->loc};
  size_t cap = 0, pcap = 0, scap = 0;
  bool loose_pipe = false;
  for (const ast_pstmt *st = p->stmts; st; st = st->next) {
    if (st->kind == PST_WORLD) {
      if (plan.world) sema_error(s, st->loc, "'world' is given twice in plan '%s'", p->name);
      int64_t w;
      if (sema_eval_bounded(s, st->world, "the world size", NTP_MAX_WORLD, &w)) plan.world = w;
      continue;
    }
    if (st->kind == PST_STAGES) {
      if (plan.even_stages) sema_error(s, st->loc, "'stages' is given twice in plan '%s'", p->name);
      int64_t n;
      if (sema_eval_bounded(s, st->world, "a stage count", NTP_MAX_WORLD, &n)) plan.even_stages = n, plan.even_loc = st->loc;
      continue;
    }
    if (st->kind == PST_OPTIMIZER) {
      lower_optimizer(s, st, &plan);
      continue;
    }
    if (st->kind == PST_SCHEDULE) {
      if (plan.schedule) sema_error(s, st->loc, "'schedule' is given twice in plan '%s'", p->name);
      else if (!ir_schedule_code(st->pattern))
        sema_error(s, st->pattern_loc, "no schedule '%s' (gpipe, 1f1b, interleaved, zb-h1)", st->pattern);
      else plan.schedule = st->pattern, plan.sched_loc = st->loc;
      continue;
    }
    if (st->kind == PST_MICRO_BATCHES) {
      if (plan.micro_batches) sema_error(s, st->loc, "'micro_batches' is given twice in plan '%s'", p->name);
      int64_t mb;
      if (sema_eval_bounded_from(s, st->world, "a micro-batch count", 1, NTP_MAX_MICRO_BATCHES, &mb))
        plan.micro_batches = (int32_t)mb, plan.mb_loc = st->loc;
      continue;
    }
    if (st->kind == PST_STAGE || st->kind == PST_PIPELINE) {
      bool loose = st->kind == PST_STAGE; /* stages outside a pipeline block: the one pipeline */
      if (loose && (!plan.npipes || !loose_pipe)) {
        if (plan.npipes) {
          sema_error(s, st->loc, "a stage outside a 'pipeline' block, beside pipeline blocks: put it in one");
          continue;
        }
        loose_pipe = true;
        VEC_PUSH(plan.pipes, plan.npipes, pcap, ((ir_pipeline){.loc = st->loc}));
        scap = 0;
      } else if (!loose) {
        if (loose_pipe) {
          sema_error(s, st->loc, "a 'pipeline' block beside stages outside one: put those in a block too");
          continue;
        }
        if (plan.npipes == NTP_MAX_PIPES) {
          sema_error(s, st->loc, "at most %d pipelines", NTP_MAX_PIPES);
          continue;
        }
        ir_pipeline pipe = {.loc = st->loc};
        if (st->world && !sema_eval_bounded(s, st->world, "a batch share", NTP_MAX_WORLD, &pipe.share)) pipe.share = 0;
        VEC_PUSH(plan.pipes, plan.npipes, pcap, pipe);
        scap = 0;
      }
      ir_pipeline *pipe = &plan.pipes[plan.npipes - 1];
      for (const ast_pstmt *g = loose ? st : st->body; g; g = loose ? NULL : g->next) {
        ir_rule r;
        if (g->kind != PST_RULE) lower_stage(s, g, pipe, &scap);
        else if (lower_rule(s, g, (int32_t)plan.npipes - 1, &r)) VEC_PUSH(plan.rules, plan.nrules, cap, r);
      }
      if (!loose && !pipe->nstages) sema_error(s, st->loc, "a pipeline without stages");
      continue;
    }
    ir_rule r;
    if (!lower_rule(s, st, -1, &r)) continue;
    VEC_PUSH(plan.rules, plan.nrules, cap, r);
  }
  /* degrees against the world, now that it is known */
  for (size_t i = 0; i < plan.nrules && plan.world && !plan.npipes && !plan.even_stages; i++) { /* stages: at placement */
    const ir_rule *r = &plan.rules[i];
    if (r->tp.kind != TP_DEGREES) continue;
    if (r->tp.n == 1 && r->tp.groups[0] > plan.world)
      sema_error(s, r->tp.loc, "TP degree %lld is larger than the world (%lld ranks)", (long long)r->tp.groups[0],
                 (long long)plan.world);
    if (r->tp.n > 1 && tp_world(&r->tp) != plan.world)
      sema_error(s, r->tp.loc, "groups sum to %lld ranks, but the world has %lld", (long long)tp_world(&r->tp),
                 (long long)plan.world);
  }
  if (active) s->m->active_plan = (int32_t)s->m->n_plans;
  VEC_PUSH(s->m->plans, s->m->n_plans, s->m->cap_plans, plan);
  s->file = saved;
}

