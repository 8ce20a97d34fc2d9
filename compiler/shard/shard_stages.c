/* shard_stages.c — a plan's pipeline stages, resolved against the model and the world.
 *
 * A plan's `stage FIRST .. LAST ranks A..B;` statements (in `pipeline { }` blocks for data
 * parallel replicas of the pipeline, or loose for one pipeline) or its `stages N;` become, per
 * pipeline, a list of chunks in layer order, each a contiguous run of layers on a rank set.
 * A rank set that comes back later in the list holds several chunks (interleaved, "virtual"
 * stages: chunk c runs on set c mod the number of sets). The checks here are every mistake a
 * plan can make with stages: a layer in no stage or in two, stages out of order, ranks outside
 * the world or shared between pipelines or between sets, interleaving that is not round robin. */
#include <stdlib.h>
#include <string.h>

#include "shard.h"
#include "shard_internal.h"

void sh_pipes_free(sh_pipes *p) {
  for (int i = 0; i < p->npipes; i++) free(p->pipe[i].stages);
  free(p->pipe_of_rank);
  free(p->set_of_rank);
  *p = (sh_pipes){0};
}

int32_t sh_pipe_chunk(const sh_pipeline *pp, int32_t l) {
  for (int32_t c = 0; c < pp->nstages; c++)
    if (l >= pp->stages[c].first_layer && l <= pp->stages[c].last_layer) return c;
  return -1;
}

/* `stages N;`: one pipeline, N stages of nearly equal layer counts on nearly equal rank sets. */
static bool even_stages(const ir_module *m, const ir_plan *plan, int32_t world, sh_pipes *out, diag_sink *diags) {
  int64_t n = plan->even_stages;
  if (n > world || n > (int64_t)m->n_layers || n > NTP_MAX_STAGES) {
    diag_emit(diags, NTPC_ERROR, plan->file, plan->even_loc, "%lld stages, but the model has %lld layers and the world %lld ranks",
              (long long)n, (long long)m->n_layers, (long long)world);
    return false;
  }
  sh_pipeline *pp = &out->pipe[0];
  out->npipes = 1;
  *pp = (sh_pipeline){.nstages = (int32_t)n, .nsets = (int32_t)n, .v = 1, .share = world};
  pp->stages = calloc((size_t)n, sizeof *pp->stages);
  if (!pp->stages) ntp_out_of_memory();
  for (int64_t i = 0; i < n; i++) {
    int64_t l0, l1, r0, r1;
    split_range((int64_t)m->n_layers, n, i, &l0, &l1);
    split_range(world, n, i, &r0, &r1);
    pp->stages[i] = (sh_stage){(int32_t)l0, (int32_t)l1 - 1, (int32_t)r0, (int32_t)r1, (int32_t)i};
  }
  return true;
}

/* One pipeline's stages: layers in order and complete, rank sets disjoint or equal, round robin. */
static bool resolve_pipe(const ir_module *m, const ir_plan *plan, const ir_pipeline *ip, int32_t world, sh_pipeline *pp,
                         diag_sink *diags) {
  const char *f = plan->file;
  size_t errs = diags->errors;
  if (ip->nstages > NTP_MAX_STAGES) {
    diag_emit(diags, NTPC_ERROR, f, ip->loc, "%zu stages: at most %d are supported", ip->nstages, NTP_MAX_STAGES);
    return false;
  }
  pp->nstages = (int32_t)ip->nstages;
  pp->stages = calloc(ip->nstages + 1, sizeof *pp->stages);
  if (!pp->stages) ntp_out_of_memory();
  int64_t ranks = 0;
  int32_t next = 0; /* the first layer the next stage must start at */
  for (size_t i = 0; i < ip->nstages; i++) {
    const ir_stage *st = &ip->stages[i];
    sh_stage *s = &pp->stages[i];
    s->first_layer = ir_layer_by_prefix(m, st->first, false);
    s->last_layer = ir_layer_by_prefix(m, st->last, true);
    if (st->rank_hi >= world) {
      diag_emit(diags, NTPC_ERROR, f, st->ranks_loc, "rank %lld is outside the world (ranks 0..%d)", (long long)st->rank_hi,
                world - 1);
      continue;
    }
    s->rank_lo = (int32_t)st->rank_lo;
    s->rank_hi = (int32_t)st->rank_hi + 1;
    if (s->first_layer < 0 || s->last_layer < 0) continue; /* reported by sema */
    if (s->last_layer < s->first_layer) {
      diag_emit(diags, NTPC_ERROR, f, st->last_loc, "stage ends at '%s', before it starts ('%s')", st->last, st->first);
      continue;
    }
    if (s->first_layer > next)
      diag_emit(diags, NTPC_ERROR, f, st->first_loc, "layer '%s' is in no stage: this stage starts at '%s'",
                m->layers[next].name, m->layers[s->first_layer].name);
    else if (s->first_layer < next)
      diag_emit(diags, NTPC_ERROR, f, st->first_loc,
                "layer '%s' is in two stages (stages must follow the layers' order, each starting after the last)",
                m->layers[s->first_layer].name);
    next = s->last_layer + 1;
  }
  if (diags->errors != errs) return false;
  if (next < (int32_t)m->n_layers) {
    const ir_stage *st = &ip->stages[ip->nstages - 1];
    diag_emit(diags, NTPC_ERROR, f, st->loc, "layer '%s' and those after it are in no stage: the last stage ends at '%s'",
              m->layers[next].name, m->layers[next - 1].name);
    return false;
  }
  /* rank sets: each stage's ranks equal an earlier stage's (interleaved) or overlap none */
  pp->nsets = 0;
  for (int32_t i = 0; i < pp->nstages; i++) {
    sh_stage *s = &pp->stages[i];
    s->set = -1;
    for (int32_t j = 0; j < i && s->set < 0; j++) {
      const sh_stage *o = &pp->stages[j];
      if (o->rank_lo == s->rank_lo && o->rank_hi == s->rank_hi) {
        s->set = o->set;
      } else if (o->rank_lo < s->rank_hi && s->rank_lo < o->rank_hi) {
        diag_emit(diags, NTPC_ERROR, f, ip->stages[i].ranks_loc,
                  "ranks %d..%d overlap the ranks %d..%d of an earlier stage of this pipeline; a rank set is shared "
                  "only whole (interleaved stages)",
                  s->rank_lo, s->rank_hi - 1, o->rank_lo, o->rank_hi - 1);
        return false;
      }
    }
    if (s->set < 0) s->set = pp->nsets++, ranks += s->rank_hi - s->rank_lo;
  }
  pp->v = pp->nstages / pp->nsets;
  if (pp->nstages % pp->nsets) {
    diag_emit(diags, NTPC_ERROR, f, ip->loc,
              "%d stages on %d rank sets: interleaved stages need the same number of chunks on every set (%d is not a "
              "multiple of %d)",
              pp->nstages, pp->nsets, pp->nstages, pp->nsets);
    return false;
  }
  for (int32_t i = 0; i < pp->nstages; i++)
    if (pp->stages[i].set != i % pp->nsets) {
      diag_emit(diags, NTPC_ERROR, f, ip->stages[i].ranks_loc,
                "interleaved stages go round robin: with %d rank sets and %d stages, stage %d should run on the ranks of "
                "stage %d (every set holds the same number of chunks, in turn)",
                pp->nsets, pp->nstages, i, pp->nsets ? i % pp->nsets : 0);
      return false;
    }
  pp->share = ip->share ? ip->share : ranks;
  return true;
}

bool shard_resolve_pipes(const ir_module *m, int32_t world, sh_pipes *out, diag_sink *diags) {
  *out = (sh_pipes){0};
  const ir_plan *plan = m->active_plan >= 0 ? &m->plans[m->active_plan] : NULL;
  if (!plan || (!plan->npipes && !plan->even_stages)) return true;
  if (plan->npipes && plan->even_stages) {
    diag_emit(diags, NTPC_ERROR, plan->file, plan->even_loc, "'stages N' and 'stage' statements in one plan: give one");
    return false;
  }
  bool ok = true;
  if (plan->even_stages) {
    ok = even_stages(m, plan, world, out, diags);
  } else {
    out->npipes = (int32_t)plan->npipes;
    for (size_t i = 0; i < plan->npipes && ok; i++) ok = resolve_pipe(m, plan, &plan->pipes[i], world, &out->pipe[i], diags);
  }
  if (!ok) {
    sh_pipes_free(out);
    return false;
  }
  out->pipe_of_rank = malloc((size_t)world * sizeof *out->pipe_of_rank);
  out->set_of_rank = malloc((size_t)world * sizeof *out->set_of_rank);
  if (!out->pipe_of_rank || !out->set_of_rank) ntp_out_of_memory();
  for (int32_t r = 0; r < world; r++) out->pipe_of_rank[r] = out->set_of_rank[r] = -1;
  for (int32_t p = 0; p < out->npipes; p++)
    for (int32_t c = 0; c < out->pipe[p].nstages; c++) {
      const sh_stage *s = &out->pipe[p].stages[c];
      for (int32_t r = s->rank_lo; r < s->rank_hi; r++) {
        if (out->pipe_of_rank[r] >= 0 && out->pipe_of_rank[r] != p) {
          const ir_pipeline *ip = plan->npipes ? &plan->pipes[p] : NULL;
          diag_emit(diags, NTPC_ERROR, plan->file, ip ? ip->stages[c].ranks_loc : plan->even_loc,
                    "rank %d is in two pipelines (%d and %d): pipelines are replicas on their own ranks", r,
                    out->pipe_of_rank[r], p);
          ok = false;
        }
        out->pipe_of_rank[r] = p;
        out->set_of_rank[r] = s->set;
      }
    }
  for (int32_t r = 0; r < world && ok; r++)
    if (out->pipe_of_rank[r] < 0) {
      diag_emit(diags, NTPC_ERROR, plan->file, plan->npipes ? plan->pipes[0].loc : plan->even_loc,
                "rank %d is in no stage: a plan with stages places every rank of the world (%d)", r, world);
      ok = false;
    }
  if (!ok) sh_pipes_free(out);
  return ok;
}
