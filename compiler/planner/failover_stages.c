/* failover_stages.c — re-planning a pipelined plan for the GPUs that survive a failure
 * (docs/pipeline.md, "Failures"; `ntpc train --fail-at` on a staged plan).
 *
 * Every pipeline replica keeps its stages' surviving GPUs. A replica whose stage lost every GPU is
 * dropped (its other GPUs idle: the survivors' world leaves them out). A replica that lost some
 * runs each stage as one tensor-parallel group of the GPUs it has left (reduced, non-uniform TP:
 * heads, hidden columns and vocabulary rows split unevenly), and — beyond the NTP paper, which kept
 * the stages' layers and restarted instead — its layers are cut again so the stages' times even out:
 * the cut that minimises the slowest stage (an exact partition over the layer chain, each layer
 * timed by the planner's tables at its stage's GPU count, each stage within the memory cap). The
 * other replicas keep their stages and the plan's rules; the degraded replica's placements are rules
 * inside its pipeline block, sequence parallelism and recomputation as the healthy plan had them.
 * A straggler (rq->slow) makes its replica degraded too: its stage's time is its slowest GPU's, so
 * the cut gives that stage fewer layers and the replica fewer rows (`ntpc train --slow`).
 *
 * Packing: where the replicas have the same stage sizes, the failures may instead be gathered into
 * as few replicas as possible — the surviving GPUs of the most damaged replicas fill the others'
 * holes, stage by stage — and that assignment is kept when its replicas' summed pace (rows per unit
 * of time, each at its best cut) is higher by more than PACK_GAIN: a stage of 2 GPUs that runs no
 * faster per GPU than 1 (3 heads split 2/1) is better twice in one replica than once in each. The
 * survivors are then numbered by pipeline and stage, not by GPU, and a moved GPU takes its new
 * slices from the copies that hold them, as after every failure.
 *
 * Interleaved stages (a rank set holding several chunks) keep their cut; a set short of GPUs runs
 * each of its chunks as one smaller group, and the replica's pace is its slowest set's (the sum of
 * its chunks' times). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planner_internal.h"

#define FS_MAX_STAGES 64
#define PACK_GAIN 1.01 /* packed only where its pace is higher by 1% */

typedef struct fs_pipe {
  int32_t nstages, kept[FS_MAX_STAGES], first_ir[FS_MAX_STAGES + 1];
  double slowest; /* its slowest stage's time per row, at the best cut for its GPUs (0: not priced) */
  double factor[FS_MAX_STAGES]; /* each stage's slowest GPU's slowdown (1: none) */
  int32_t ranks[FS_MAX_STAGES][NTP_MAX_GROUPS]; /* the stage's surviving GPUs (physical), in order */
  bool dropped, degraded;
} fs_pipe;

/* Layer l's time and memory on a stage of n GPUs as one group (sp and rc as the healthy plan had
 * them); tabs[n] built on first use. */
static plan_tables *table_for(const plan_model *pm, const plan_request *rq, int32_t n, plan_tables **tabs,
                              diag_sink *diags) {
  if (tabs[n]) return tabs[n];
  plan_place st[4];
  for (int v = 0; v < 4; v++) {
    st[v] = plan_place_balanced(n, 1, v & 1);
    st[v].rc = (v & 2) != 0;
  }
  return tabs[n] = pl_tables_build(pm, rq->prof, n, NULL, rq->nodes_of, st, 4, NULL, rq->train, diags);
}

static int32_t state_of_layer(const sh_placement *hp) { return (hp->seq_parallel ? 1 : 0) + (hp->recompute ? 2 : 0); }

/* The exact cut of the chain into the stages of sizes n[0..p) minimising the slowest stage's time
 * (each stage within the cap); first[i] chain layers. false when no cut fits. */
static bool recut(const plan_model *pm, const plan_request *rq, const sh_program *hp, const int32_t *n,
                  const double *factor, int32_t p, plan_tables **tabs, int32_t *first, double *slowest, diag_sink *diags) {
  int32_t L = pm->n;
  double cap = pl_cap_of(rq);
  double *best = malloc((size_t)(p + 1) * (L + 1) * sizeof *best);
  int32_t *arg = malloc((size_t)(p + 1) * (L + 1) * sizeof *arg);
  double *t = calloc((size_t)p * (L + 1), sizeof *t), *mem = calloc((size_t)p * (L + 1), sizeof *mem);
  bool ok = best && arg && t && mem;
  for (int32_t i = 0; ok && i < p; i++) { /* prefix sums of each layer's time and memory at stage i's size */
    plan_tables *T = table_for(pm, rq, n[i], tabs, diags);
    if (!T) ok = false;
    for (int32_t l = 0; ok && l < L; l++) {
      size_t k = (size_t)l * T->S + state_of_layer(&hp->placements[plan_model_ir_layer(pm, l)]);
      bool legal = T->legal[k];
      t[(size_t)i * (L + 1) + l + 1] = t[(size_t)i * (L + 1) + l] + (legal ? (T->tcomp[k] + T->tcomm[k]) * factor[i] : INFINITY);
      mem[(size_t)i * (L + 1) + l + 1] = mem[(size_t)i * (L + 1) + l] + T->pmax[k] + T->amax[k];
    }
  }
  for (int32_t i = 0; ok && i <= p; i++)
    for (int32_t e = 0; e <= L; e++) best[(size_t)i * (L + 1) + e] = INFINITY;
  if (ok) best[0] = 0;
  for (int32_t i = 1; ok && i <= p; i++) /* best[i][e]: the slowest of stages 0..i-1 over layers [0, e) */
    for (int32_t e = i; e <= L - (p - i); e++)
      for (int32_t a = i - 1; a < e; a++) {
        const double *ti = t + (size_t)(i - 1) * (L + 1), *mi = mem + (size_t)(i - 1) * (L + 1);
        double st = ti[e] - ti[a], prev = best[(size_t)(i - 1) * (L + 1) + a], v = st > prev ? st : prev;
        if (mi[e] - mi[a] > cap || !(v < best[(size_t)i * (L + 1) + e])) continue;
        best[(size_t)i * (L + 1) + e] = v;
        arg[(size_t)i * (L + 1) + e] = a;
      }
  ok = ok && isfinite(best[(size_t)p * (L + 1) + L]);
  if (ok) *slowest = best[(size_t)p * (L + 1) + L];
  for (int32_t i = p, e = L; ok && i > 0; i--) first[i] = e, e = arg[(size_t)i * (L + 1) + e];
  if (ok) first[0] = 0;
  free(best);
  free(arg);
  free(t);
  free(mem);
  return ok;
}

/* the IR layer each stage of the degraded replica starts at: after the previous stage's last chain layer */
static void stage_starts(const plan_model *pm, const ir_module *m, const int32_t *first, int32_t p, int32_t *first_ir) {
  first_ir[0] = 0;
  for (int32_t i = 1; i < p; i++) first_ir[i] = plan_model_ir_layer(pm, first[i] - 1) + 1;
  first_ir[p] = (int32_t)m->n_layers;
}

/* An interleaved pipeline's slowest rank set at its cut: each set runs its chunks in turn, each chunk
 * one group of the set's GPUs (timed by the planner's tables at that count, its straggler's factor);
 * 0 when a set's layers do not fit the cap or a layer has no placement there. */
static double interleaved_time(const plan_model *pm, const plan_request *rq, const sh_program *hp,
                               const sh_pipeline *P, const fs_pipe *fp, plan_tables **tabs, diag_sink *quiet) {
  double t[FS_MAX_STAGES] = {0}, mem[FS_MAX_STAGES] = {0}, slowest = 0;
  for (int32_t l = 0, i = 0; l < pm->n; l++) {
    int32_t ir = plan_model_ir_layer(pm, l);
    while (i + 1 < P->nstages && ir >= P->stages[i + 1].first_layer) i++;
    plan_tables *T = table_for(pm, rq, fp->kept[i], tabs, quiet);
    if (!T) return 0;
    size_t k = (size_t)l * T->S + state_of_layer(&hp->placements[ir]);
    if (!T->legal[k]) return 0;
    t[i % P->nsets] += (T->tcomp[k] + T->tcomm[k]) * fp->factor[i];
    mem[i % P->nsets] += T->pmax[k] + T->amax[k];
  }
  for (int32_t s = 0; s < P->nsets; s++) {
    if (mem[s] > pl_cap_of(rq)) return 0;
    slowest = fmax(slowest, t[s]);
  }
  return slowest;
}

/* Pipeline pi of the survivors from the GPUs it holds (fp->ranks, fp->kept): dropped when a stage
 * has none, degraded when one has fewer than the plan's or a straggler; every kept replica priced at
 * the best cut for its GPUs (the rows are shared by that pace); a degraded one's layers cut again,
 * a healthy one keeps its own cut. */
static void price_pipe(const plan_model *pm, const ir_module *m, const sh_program *hp, const plan_request *rq,
                       int32_t pi, fs_pipe *fp, plan_tables **tabs, diag_sink *quiet) {
  const sh_pipeline *P = &hp->pipes.pipe[pi];
  fp->dropped = fp->degraded = false;
  fp->slowest = 0;
  for (int32_t i = 0; i < P->nstages; i++) {
    const sh_stage *st = &P->stages[i];
    fp->factor[i] = 1;
    for (int32_t k = 0; rq->slow && k < fp->kept[i]; k++) fp->factor[i] = fmax(fp->factor[i], rq->slow[fp->ranks[i][k]]);
    fp->dropped |= fp->kept[i] == 0;
    fp->degraded |= fp->kept[i] < st->rank_hi - st->rank_lo || fp->factor[i] > 1;
    fp->first_ir[i] = st->first_layer;
  }
  fp->first_ir[P->nstages] = (int32_t)m->n_layers;
  int32_t first[FS_MAX_STAGES + 1];
  if (P->v > 1) { /* interleaved: the cut kept (a rank set runs its chunks in turn) */
    if (!fp->dropped) fp->slowest = interleaved_time(pm, rq, hp, P, fp, tabs, quiet);
    return;
  }
  if (fp->dropped || !recut(pm, rq, hp, fp->kept, fp->factor, fp->nstages, tabs, first, &fp->slowest, quiet)) {
    fp->slowest = 0; /* dropped, or no cut fits: the cut kept */
    return;
  }
  if (fp->degraded) stage_starts(pm, m, first, fp->nstages, fp->first_ir);
  if (rq->pipe_scale && rq->pipe_scale[pi] > 0) fp->slowest /= rq->pipe_scale[pi];
}

/* the replicas' summed pace (rows per unit of time); 0 when one kept is not priced */
static double pace_of(const fs_pipe *fps, int32_t n) {
  double pace = 0;
  for (int32_t pi = 0; pi < n; pi++) {
    if (fps[pi].dropped) continue;
    if (!(fps[pi].slowest > 0)) return 0;
    pace += 1 / fps[pi].slowest;
  }
  return pace;
}

static int cmp_rank(const void *a, const void *b) { return *(const int32_t *)a - *(const int32_t *)b; }

/* The failures gathered into as few replicas as possible: stage by stage, the least damaged
 * replicas' holes filled from the most damaged ones' survivors. false when the replicas' stage sizes
 * differ or no GPU moves. */
static bool pack(const sh_pipes *pp, const fs_pipe *spread, fs_pipe *out) {
  int32_t n = pp->npipes, order[NTP_MAX_PIPES], lost[NTP_MAX_PIPES];
  const sh_pipeline *P0 = &pp->pipe[0];
  for (int32_t pi = 0; pi < n; pi++) {
    const sh_pipeline *P = &pp->pipe[pi];
    if (P->nstages != P0->nstages || P->v > 1) return false; /* a set's chunks share its GPUs: not moved */
    lost[pi] = 0;
    for (int32_t i = 0; i < P->nstages; i++) {
      int32_t size = P->stages[i].rank_hi - P->stages[i].rank_lo;
      if (size != P0->stages[i].rank_hi - P0->stages[i].rank_lo) return false;
      lost[pi] += size - spread[pi].kept[i];
    }
    int32_t at = pi; /* the most damaged first, in replica order among equals */
    while (at > 0 && lost[order[at - 1]] < lost[pi]) order[at] = order[at - 1], at--;
    order[at] = pi;
  }
  memcpy(out, spread, (size_t)n * sizeof *out);
  bool moved = false;
  for (int32_t i = 0; i < P0->nstages; i++) {
    int32_t size = P0->stages[i].rank_hi - P0->stages[i].rank_lo;
    for (int32_t a = n - 1; a > 0; a--) {
      fs_pipe *to = &out[order[a]];
      for (int32_t b = 0; b < a && to->kept[i] < size; b++)
        for (fs_pipe *from = &out[order[b]]; from->kept[i] > 0 && to->kept[i] < size; moved = true)
          to->ranks[i][to->kept[i]++] = from->ranks[i][--from->kept[i]];
      qsort(to->ranks[i], (size_t)to->kept[i], sizeof to->ranks[i][0], cmp_rank);
    }
  }
  return moved;
}

static void write_rule(FILE *out, const char *indent, const char *pattern, const ir_tp *tp, bool sp, bool rc,
                       const ir_rule *r) {
  fprintf(out, "%s%s ", indent, pattern);
  ir_print_tp(tp, out);
  if (sp) fputs(", sequence_parallel", out);
  if (rc) fputs(", recompute", out);
  for (int b = 0; r && b < r->nbatch; b++) fprintf(out, "%s%lld%s", b ? ", " : ", batch (", (long long)r->batch[b],
                                                   b + 1 == r->nbatch ? ")" : "");
  fputs(";\n", out);
}

static void write_pipe(FILE *out, const ir_module *m, const sh_program *hp, const fs_pipe *fp, int32_t pi,
                       const int32_t *new_rank, int32_t newpi, double share_unit) {
  const ir_plan *plan = &m->plans[m->active_plan];
  if (fp->slowest > 0) fprintf(out, "  pipeline batch %.0f {\n", 1e6 / fp->slowest / share_unit);
  else fputs("  pipeline {\n", out);
  for (int32_t i = 0; i < fp->nstages; i++) {
    int32_t lo = new_rank[fp->ranks[i][0]], hi = new_rank[fp->ranks[i][fp->kept[i] - 1]];
    fprintf(out, "    stage %s .. %s ranks %d..%d;\n", m->layers[fp->first_ir[i]].name,
            m->layers[fp->first_ir[i + 1] - 1].name, lo, hi);
  }
  for (size_t r = 0; !fp->degraded && r < plan->nrules; r++) /* the healthy replica's own rules */
    if (plan->rules[r].pipe == pi)
      write_rule(out, "    ", plan->rules[r].pattern, &plan->rules[r].tp, plan->rules[r].seq_parallel,
                 plan->rules[r].recompute, &plan->rules[r]);
  for (int32_t i = 0; fp->degraded && i < fp->nstages; i++) /* every layer: one group of the stage's GPUs */
    for (int32_t l = fp->first_ir[i]; l < fp->first_ir[i + 1]; l++) {
      ir_tp tp = {.kind = TP_DEGREES, .n = 1};
      tp.groups[0] = fp->kept[i];
      write_rule(out, "    ", m->layers[l].name, &tp, hp->placements[l].seq_parallel, hp->placements[l].recompute, NULL);
    }
  fputs("  }\n", out);
  (void)newpi;
}

/* the survivors' plan: its world, the replicas (each with its batch share by its pace, where every one
 * was priced; else in proportion to its GPUs), the healthy plan's rules for every pipeline; when
 * packed (its pace over the spread one's, > 0), the GPUs that serve another replica */
static void write_survivors(FILE *out, const ir_module *m, const sh_program *hp, fs_pipe *fps, const int32_t *new_rank,
                            int32_t W, double packed) {
  const sh_pipes *pp = &hp->pipes;
  const ir_plan *plan = &m->plans[m->active_plan];
  fprintf(out, "plan survivors for %s {\n  world %d;\n", m->name, W);
  if (packed > 0 && isfinite(packed))
    fprintf(out, "  // packed: the failures gathered into few replicas, %.1f%% more rows per unit of time than each "
            "replica keeping its own survivors\n", 100 * (packed - 1));
  else if (packed > 0)
    fprintf(out, "  // packed: the failures gathered into few replicas (with each keeping its own survivors no cut fits)\n");
  for (int32_t pi = 0; packed && pi < pp->npipes; pi++)
    for (int32_t i = 0; !fps[pi].dropped && i < fps[pi].nstages; i++)
      for (int32_t k = 0; k < fps[pi].kept[i]; k++)
        if (pp->pipe_of_rank[fps[pi].ranks[i][k]] != pi)
          fprintf(out, "  // packed: GPU %d of replica %d serves replica %d's stage %d as rank %d\n",
                  fps[pi].ranks[i][k], pp->pipe_of_rank[fps[pi].ranks[i][k]], pi, i, new_rank[fps[pi].ranks[i][k]]);
  for (int32_t pi = 0; pi < pp->npipes; pi++) {
    if (!fps[pi].dropped) continue;
    fprintf(out, "  // dropped: replica %d, a stage without a GPU; idle:", pi);
    for (int32_t i = 0; i < fps[pi].nstages; i++)
      for (int32_t k = 0; k < fps[pi].kept[i]; k++) fprintf(out, " GPU %d", fps[pi].ranks[i][k]);
    fputc('\n', out);
  }
  if (hp->micro_batches > 1) fprintf(out, "  micro_batches %d;\n", hp->micro_batches);
  if (plan->zero_loc.first_line)
    fprintf(out, "  optimizer zero %d redundancy %d%s%.0d;\n", plan->zero, plan->zero ? plan->redundancy : 1,
            plan->domain_size ? " domain " : "", plan->domain_size);
  /* the batch shares in thousandths of the fastest replica's pace */
  double fastest = 0;
  bool priced = true;
  for (int32_t pi = 0; pi < pp->npipes; pi++)
    if (!fps[pi].dropped) priced &= fps[pi].slowest > 0, fastest = fmax(fastest, fps[pi].slowest > 0 ? 1 / fps[pi].slowest : 0);
  for (int32_t pi = 0; pi < pp->npipes && !priced; pi++) fps[pi].slowest = 0;
  for (int32_t pi = 0, np = 0; pi < pp->npipes; pi++)
    if (!fps[pi].dropped) write_pipe(out, m, hp, &fps[pi], pi, new_rank, np++, fastest > 0 ? fastest * 1000 : 1);
  for (size_t r = 0; r < plan->nrules; r++)
    if (plan->rules[r].pipe < 0)
      write_rule(out, "  ", plan->rules[r].pattern, &plan->rules[r].tp, plan->rules[r].seq_parallel,
                 plan->rules[r].recompute, &plan->rules[r]);
  fputs("}\n", out);
}

bool plan_failover_stages(const plan_model *pm, const ir_module *m, const sh_program *hp, const plan_request *rq,
                          FILE *out, int32_t **phys, int32_t *world, char *why, size_t cap) {
  const sh_pipes *pp = &hp->pipes;
  const ir_plan *plan = m->active_plan >= 0 ? &m->plans[m->active_plan] : NULL;
  *phys = NULL;
  if (!plan || !pp->npipes) return snprintf(why, cap, "the plan has no pipelines"), false;
  bool *dead = calloc((size_t)hp->world, 1);
  int32_t *new_rank = malloc((size_t)hp->world * sizeof *new_rank), nkept = 0;
  fs_pipe *fps = calloc((size_t)pp->npipes, sizeof *fps), *packs = calloc((size_t)pp->npipes, sizeof *packs);
  plan_tables **tabs = calloc(NTP_MAX_GROUPS + 1, sizeof *tabs);
  diag_sink quiet = {0}; /* a stage too small for a layer: its cut is kept */
  bool ok = dead && new_rank && fps && tabs;
  for (int32_t k = 0; ok && k < rq->nfailed; k++) dead[rq->failed[k]] = true;
  for (int32_t pi = 0; ok && pi < pp->npipes; pi++) {
    const sh_pipeline *P = &pp->pipe[pi];
    if (P->nstages > FS_MAX_STAGES) {
      snprintf(why, cap, "a pipeline of more than %d stages is not re-planned", FS_MAX_STAGES);
      ok = false;
      break;
    }
    fps[pi].nstages = P->nstages;
    for (int32_t i = 0; i < P->nstages; i++) /* each replica keeps its stages' survivors */
      for (int32_t r = P->stages[i].rank_lo; r < P->stages[i].rank_hi; r++)
        if (!dead[r] && fps[pi].kept[i] < NTP_MAX_GROUPS) fps[pi].ranks[i][fps[pi].kept[i]++] = r;
  }
  for (int32_t pi = 0; ok && pi < pp->npipes; pi++) price_pipe(pm, m, hp, rq, pi, &fps[pi], tabs, &quiet);
  bool packed = false;
  double gain = 0; /* the packed assignment's pace over the spread one's */
  if (ok && packs && pack(pp, fps, packs)) { /* the failures gathered into few replicas, if faster */
    for (int32_t pi = 0; pi < pp->npipes; pi++) price_pipe(pm, m, hp, rq, pi, &packs[pi], tabs, &quiet);
    double spread = pace_of(fps, pp->npipes), gathered = pace_of(packs, pp->npipes);
    gain = spread > 0 ? gathered / spread : gathered > 0 ? INFINITY : 0; /* unpriced spread: packed if priced */
    if ((packed = gain > PACK_GAIN)) {
      fs_pipe *t = fps;
      fps = packs, packs = t;
    }
  }
  for (int32_t pi = 0; ok && pi < pp->npipes; pi++) nkept += !fps[pi].dropped;
  if (ok && !nkept) snprintf(why, cap, "every pipeline replica lost a whole stage"), ok = false;
  int32_t W = 0;
  for (int32_t r = 0; ok && r < hp->world; r++) new_rank[r] = -1;
  for (int32_t pi = 0; ok && pi < pp->npipes; pi++) /* the survivors kept: by pipeline and stage */
    for (int32_t i = 0; !fps[pi].dropped && i < fps[pi].nstages; i++)
      for (int32_t k = 0; k < fps[pi].kept[i]; k++) new_rank[fps[pi].ranks[i][k]] = packed ? W++ : 0;
  for (int32_t r = 0; ok && !packed && r < hp->world; r++) /* not packed: in physical order */
    if (new_rank[r] == 0) new_rank[r] = W++;
  if (ok && !(*phys = malloc((size_t)W * sizeof **phys))) ok = false;
  for (int32_t r = 0; ok && r < hp->world; r++)
    if (new_rank[r] >= 0) (*phys)[new_rank[r]] = r;
  if (ok) {
    *world = W;
    write_survivors(out, m, hp, fps, new_rank, W, packed ? gain : 0);
  }
  for (int32_t n = 0; tabs && n <= NTP_MAX_GROUPS; n++) plan_tables_free(tabs[n]);
  free(tabs);
  diag_free(&quiet);
  free(dead);
  free(new_rank);
  free(fps);
  free(packs);
  if (!ok) {
    free(*phys);
    *phys = NULL;
  }
  return ok;
}
