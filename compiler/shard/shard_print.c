/* shard_print.c — the sharded program as text: the whole step list (--emit=sharded-ir),
 * one rank's program with its memory plan (--emit=rank:N), and the static report. */
#include <stdlib.h>
#include <string.h>

#include "grad.h"
#include "layer_kind.h"
#include "shard.h"

const char *sh_human_bytes(int64_t b, char *buf, size_t cap) {
  static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    u++;
  }
  if (u == 0) snprintf(buf, cap, "%lld B", (long long)b);
  else snprintf(buf, cap, "%.1f %s", v, unit[u]);
  return buf;
}
#define human sh_human_bytes

static void print_placement(const sh_program *p, size_t l, FILE *out) {
  const ir_layer *ly = &p->global->layers[l];
  const sh_placement *pl = &p->placements[l];
  if (!layer_is_sharded(ly)) {
    fprintf(out, "placement %s: follows its input (computed where its input rows are)\n", ly->name);
    return;
  }
  fprintf(out, "placement %s: groups (", ly->name);
  for (int g = 0; g < pl->ngroups; g++)
    fprintf(out, "%s%d", g ? ", " : "", sh_group_size(pl, g));
  fputs(") rows", out);
  for (int g = 0; g < pl->ngroups; g++)
    fprintf(out, " [%lld:%lld)", (long long)pl->row_start[g], (long long)pl->row_start[g + 1]);
  if (pl->seq_parallel) fputs(", sequence parallel", out);
  if (pl->recompute) fputs(", recompute", out);
  fputc('\n', out);
}

static void print_tensor_type(const sh_tensor *t, FILE *out) {
  ntp_shape s = box_shape(&t->box);
  char buf[128];
  fprintf(out, "%s%s", dtype_name(t->dtype), shape_str(&s, buf, sizeof buf));
}

static void print_compute(const sh_program *p, const sh_step *st, FILE *out) {
  const sh_tensor *t = &p->tensors[st->op.result];
  char buf[160];
  fprintf(out, "t%d = %s", st->op.result, ir_op_name(st->op.code));
  if (st->op.code == IR_INPUT || st->op.code == IR_PARAM)
    fprintf(out, " %s%s", t->name, box_str(&t->init_box, buf, sizeof buf));
  for (int a = 0; a < st->op.nargs; a++) fprintf(out, "%st%d", a ? ", " : " ", st->op.args[a]);
  fputs(" : ", out);
  print_tensor_type(t, out);
  ir_print_attrs(&st->op, out);
  if (t->global >= 0 && st->op.code != IR_INPUT && st->op.code != IR_PARAM)
    fprintf(out, "  # %%%d%s", t->global, box_str(&t->box, buf, sizeof buf));
}

static void print_comm_head(const sh_step *st, FILE *out) {
  fprintf(out, "%s {", sh_comm_name(st->comm));
  for (int i = 0; i < st->nranks; i++) fprintf(out, "%s%d", i ? "," : "", st->ranks[i]);
  fprintf(out, "} %lld elems", (long long)st->elems);
  if (st->why) fprintf(out, "  # %s", st->why);
  fputc('\n', out);
}

static const char *layer_name(const sh_program *p, int32_t l) {
  return l >= 0 ? p->global->layers[l].name : "model level";
}

void sh_print(const sh_program *p, FILE *out) {
  fprintf(out, "sharded %s: world %d, %zu steps, %zu tensors\n", p->global->name, p->world, p->n_steps, p->n_tensors);
  for (size_t l = 0; l < p->global->n_layers; l++) print_placement(p, l, out);
  for (size_t i = 0; i < p->n_notes; i++) fprintf(out, "matmul %s\n", p->notes[i]);
  int32_t layer = -2;
  char buf[160];
  for (size_t s = 0; s < p->n_steps; s++) {
    const sh_step *st = &p->steps[s];
    if (st->layer != layer) {
      layer = st->layer;
      fprintf(out, "%s:\n", layer_name(p, layer));
    }
    if (st->kind == SH_COMPUTE) {
      fprintf(out, "  r%d ", st->rank);
      print_compute(p, st, out);
      fputc('\n', out);
      continue;
    }
    fputs("  ", out);
    print_comm_head(st, out);
    for (size_t x = 0; x < st->nxfers; x++) {
      const sh_xfer *xf = &st->xfers[x];
      fprintf(out, "    t%d@r%d -> t%d@r%d %s\n", xf->src, p->tensors[xf->src].rank, xf->dst, p->tensors[xf->dst].rank,
              box_str(&xf->box, buf, sizeof buf));
    }
  }
  for (size_t o = 0; o < p->global->n_outputs; o++) {
    int32_t v = p->global->outputs[o].value;
    fprintf(out, "output %s = %%%d:", p->global->outputs[o].name, v);
    for (size_t i = 0; i < p->npieces[v]; i++) {
      const sh_tensor *t = &p->tensors[p->pieces[v][i]];
      fprintf(out, " t%d@r%d%s", p->pieces[v][i], t->rank, box_str(&t->box, buf, sizeof buf));
    }
    fputc('\n', out);
  }
}

void sh_print_rank(const sh_program *p, int32_t rank, FILE *out) {
  const sh_rank_mem *m = &p->mem[rank];
  char a[32], b[32], c[32], d[32], e[32], buf[160];
  fprintf(out, "rank %d of %d (%s): params %s, inputs %s, arena %s (peak activations), sent %s, received %s\n", rank,
          p->world, p->global->name, human(m->param_bytes, a, 32), human(m->input_bytes, b, 32),
          human(m->arena_bytes, c, 32), human(m->bytes_sent, d, 32), human(m->bytes_received, e, 32));
  int32_t layer = -2;
  for (size_t s = 0; s < p->n_steps; s++) {
    const sh_step *st = &p->steps[s];
    bool mine = st->kind == SH_COMPUTE ? st->rank == rank : false;
    if (st->kind == SH_COMM)
      for (int i = 0; i < st->nranks; i++) mine |= st->ranks[i] == rank;
    if (!mine) continue;
    if (st->layer != layer) {
      layer = st->layer;
      fprintf(out, "%s:\n", layer_name(p, layer));
    }
    if (p->pipelined) { /* the schedule's action the step is part of: chunk, F/B/W, micro-batch */
      if (st->mb < 0) fputs("  [   ]", out);
      else fprintf(out, "  [%d%s%d]", sh_rank_chunk(p, rank, st->at_layer), sh_phase_letter(sh_action_phase(p, st)), st->mb);
    }
    if (st->kind == SH_COMPUTE) {
      const sh_tensor *t = &p->tensors[st->op.result];
      fputs("  ", out);
      print_compute(p, st, out);
      fprintf(out, "  @%s+%lld\n", t->persistent ? "params" : "arena", (long long)t->offset);
      continue;
    }
    fputs("  ", out);
    print_comm_head(st, out);
    for (size_t x = 0; x < st->nxfers; x++) {
      const sh_xfer *xf = &st->xfers[x];
      const sh_tensor *src = &p->tensors[xf->src], *dst = &p->tensors[xf->dst];
      if (src->rank != rank && dst->rank != rank) continue;
      if (src->rank == rank && dst->rank == rank) fprintf(out, "    copy t%d -> t%d", xf->src, xf->dst);
      else if (src->rank == rank) fprintf(out, "    send t%d -> rank %d", xf->src, dst->rank);
      else fprintf(out, "    recv t%d <- rank %d", xf->dst, src->rank);
      fprintf(out, " %s", box_str(&xf->box, buf, sizeof buf));
      if (dst->rank == rank) fprintf(out, "  t%d @arena+%lld", xf->dst, (long long)dst->offset);
      fputc('\n', out);
    }
  }
}

/* Bytes alive on each rank at each step (difference arrays over lifetimes). */
static int64_t *live_bytes(const sh_program *p) {
  size_t S = p->n_steps + 2;
  int64_t *live = calloc((size_t)p->world * S, sizeof *live);
  if (!live) return NULL;
  for (size_t i = 0; i < p->n_tensors; i++) {
    const sh_tensor *t = &p->tensors[i];
    if (t->persistent || t->def < 0) continue;
    int64_t b = box_volume(&t->box) * (int64_t)dtype_bytes(t->dtype);
    live[(size_t)t->rank * S + (size_t)t->def] += b;
    live[(size_t)t->rank * S + (size_t)t->last_use + 1] -= b;
  }
  for (int32_t r = 0; r < p->world; r++)
    for (size_t s = 1; s < S; s++) live[(size_t)r * S + s] += live[(size_t)r * S + s - 1];
  return live;
}

/* All ranks' bytes of the sync of gradient value gv, as all-reduces over each cell's holders
 * (ring: 2(n-1) of the cell in all, for n holders): the same count the step's bytes use. */
static double ring_total(const sh_program *p, const sh_step *sync, int32_t gv, ntp_shape shape, ntp_dtype dt) {
  size_t nh = 0;
  ntp_box *boxes = malloc((sync->nxfers + 1) * sizeof *boxes);
  int32_t *seen = malloc((sync->nxfers + 1) * sizeof *seen);
  double total = 0;
  if (!boxes || !seen) goto done;
  for (size_t x = 0; x < sync->nxfers; x++) {
    int32_t d = sync->xfers[x].dst;
    if (p->tensors[d].global != gv) continue;
    bool dup = false;
    for (size_t k = 0; k < nh; k++) dup |= seen[k] == d;
    if (!dup) seen[nh] = d, boxes[nh++] = p->tensors[d].box;
  }
  ntp_box whole = box_full(&shape), cell;
  box_grid g;
  if (!nh || !box_grid_init(&g, &whole, boxes, nh)) goto done;
  while (box_grid_next(&g, &cell)) {
    int n = 0;
    for (size_t k = 0; k < nh; k++) n += box_contains(&boxes[k], &cell);
    if (n > 1) total += 2.0 * (n - 1) * (double)box_volume(&cell) * (double)dtype_bytes(dt);
  }
  box_grid_free(&g);
done:
  free(boxes);
  free(seen);
  return total;
}

/* Training: what the gradient sync moves per rank, and what Megatron's non-uniform TP scheme
 * (megatron/core/distributed/nonuniform_tp.py) would move for the same placements: in a layer
 * whose groups have two sizes (healthy t, reduced r), the spare ranks of each healthy group
 * send their pieces to its core ranks (an all-to-all), the core ranks all-reduce over the G
 * groups (ring: 2(G-1)/G of a P/r piece each), and the pieces go back to the spares; a layer of
 * one size is the all-reduce alone. Both counted for the TP-sharded layers' own parameters. */
static void print_grad_sync(const sh_program *p, FILE *out) {
  const ir_module *m = p->global;
  const sh_step *sync = NULL;
  for (size_t s = 0; s < p->n_steps; s++)
    if (p->steps[s].kind == SH_COMM && p->steps[s].why && !strncmp(p->steps[s].why, "gradient sync", 13)) sync = &p->steps[s];
  if (!sync || p->zero) return; /* the distributed optimizer's: sh_print_optimizer */
  char a[32], b[32], c[32];
  fprintf(out, "\ngradient sync (one step: every parameter slice summed over its holders; bytes as all-reduces over "
               "each cell's holders)\n  %-5s %12s %12s\n", "rank",
          "sent", "received");
  int64_t total = 0;
  for (int i = 0; i < sync->nranks; i++) {
    fprintf(out, "  %-5d %12s %12s\n", sync->ranks[i], human(sync->bytes_out[i], a, 32), human(sync->bytes_in[i], b, 32));
    total += sync->bytes_out[i];
  }
  /* the TP-sharded layers' parameters: ours against Megatron's scheme */
  double ours = 0, mega = 0, pre = 0;
  int compared = 0, skipped = 0;
  for (size_t l = 0; l < m->n_layers; l++) {
    const ir_layer *ly = &m->layers[l];
    if (!layer_is_sharded(ly)) continue;
    const sh_placement *pl = &p->placements[l];
    int32_t t = 0, r = INT32_MAX;
    for (int g = 0; g < pl->ngroups; g++) {
      int32_t sz = sh_group_size(pl, g);
      t = sz > t ? sz : t;
      r = sz < r ? sz : r;
    }
    bool two = true;
    for (int g = 0; g < pl->ngroups; g++) {
      int32_t sz = sh_group_size(pl, g);
      two &= sz == t || sz == r;
    }
    double P = 0, o = 0;
    for (int32_t i = ly->first_op; i < ly->first_op + ly->nops; i++) {
      if (m->ops[i].code != IR_PARAM) continue;
      int32_t v = m->ops[i].result, gv = ir_grad_output(m, v);
      P += (double)shape_numel(&m->values[v].shape) * (double)dtype_bytes(m->values[v].dtype);
      o += ring_total(p, sync, gv, m->values[v].shape, m->values[v].dtype);
    }
    if (P == 0) continue;
    if (!two) {
      skipped++;
      continue;
    }
    compared++;
    ours += o;
    double G = pl->ngroups, a2a = 0;
    for (int g = 0; g < pl->ngroups; g++) {
      int32_t sz = sh_group_size(pl, g);
      if (sz > r) a2a += P * (double)(sz - r) / (double)sz;
    }
    pre += a2a;
    mega += 2 * a2a + 2 * (G - 1) * P;
  }
  fprintf(out, "  all ranks: %s sent", human(total, a, 32));
  if (compared)
    fprintf(out, "; for the %d TP-sharded layers: %s, where Megatron's scheme would move %s (%s of it the spares' "
                 "all-to-alls before and after)",
            compared, human((int64_t)ours, a, 32), human((int64_t)mega, b, 32), human((int64_t)(2 * pre), c, 32));
  if (skipped) fprintf(out, "; %d layer%s with more than two group sizes, which that scheme does not take", skipped,
                       skipped == 1 ? "" : "s");
  fputc('\n', out);
}

/* The report's per-layer tables: per layer slot (nl - 1: the model level) and rank, and the
 * steps bucketed by layer (a counting sort), so printing each layer's collectives does not walk
 * every step once per layer: layer l's steps are order[start[l]..start[l + 1]). */
typedef struct layer_tables {
  size_t nl;
  int32_t W;
  int64_t *params, *peak, *sent, *recv;
  size_t *start, *order;
} layer_tables;

static size_t layer_slot(const layer_tables *lt, const sh_step *st) {
  return st->layer >= 0 ? (size_t)st->layer : lt->nl - 1;
}

static void bucket_steps(const sh_program *p, layer_tables *lt) {
  size_t nl = lt->nl, *start = lt->start;
  for (size_t s = 0; s < p->n_steps; s++) start[layer_slot(lt, &p->steps[s]) + 1]++;
  for (size_t l = 0; l < nl; l++) start[l + 1] += start[l];
  for (size_t s = 0; s < p->n_steps; s++) lt->order[start[layer_slot(lt, &p->steps[s])]++] = s;
  for (size_t l = nl; l > 0; l--) start[l] = start[l - 1]; /* the fill moved each start to the next's */
  start[0] = 0;
}

/* Parameters materialised, bytes sent and received, and the activation peak (live: per rank
 * and step), per layer and rank. */
static void tally_steps(const sh_program *p, const int64_t *live, layer_tables *lt) {
  int32_t W = lt->W;
  size_t S = p->n_steps + 2;
  for (size_t s = 0; s < p->n_steps; s++) {
    const sh_step *st = &p->steps[s];
    size_t l = layer_slot(lt, st);
    if (st->kind == SH_COMPUTE) {
      const sh_tensor *t = &p->tensors[st->op.result];
      if (t->persistent) lt->params[l * (size_t)W + (size_t)t->rank] += box_volume(&t->box) * (int64_t)dtype_bytes(t->dtype);
    } else {
      for (int i = 0; i < st->nranks; i++) {
        lt->sent[l * (size_t)W + (size_t)st->ranks[i]] += st->bytes_out[i];
        lt->recv[l * (size_t)W + (size_t)st->ranks[i]] += st->bytes_in[i];
      }
    }
    for (int32_t r = 0; r < W; r++) {
      int64_t v = live[(size_t)r * S + s];
      if (v > lt->peak[l * (size_t)W + (size_t)r]) lt->peak[l * (size_t)W + (size_t)r] = v;
    }
  }
}

/* Layer slot l's table (none when it holds nothing and moves nothing) and its collectives. */
static void print_layer(const sh_program *p, const layer_tables *lt, size_t l, FILE *out) {
  const ir_module *m = p->global;
  int32_t W = lt->W;
  char a[32], b[32], c[32], d[32];
  bool any = false;
  for (int32_t r = 0; r < W; r++)
    any |= lt->params[l * (size_t)W + (size_t)r] || lt->sent[l * (size_t)W + (size_t)r] || lt->peak[l * (size_t)W + (size_t)r];
  if (!any) return;
  if (l < lt->nl - 1) {
    const ir_layer *ly = &m->layers[l];
    fprintf(out, "\n%s (%s) ", ly->name, layer_kind_of(ly)->name);
    print_placement(p, l, out);
  } else {
    fputs("\nmodel level (residual adds, explicit ops)\n", out);
  }
  fprintf(out, "  %-5s %12s %14s %12s %12s\n", "rank", "params", "peak activ.", "sent", "received");
  for (int32_t r = 0; r < W; r++) {
    size_t k = l * (size_t)W + (size_t)r;
    fprintf(out, "  %-5d %12s %14s %12s %12s\n", r, human(lt->params[k], a, 32), human(lt->peak[k], b, 32),
            human(lt->sent[k], c, 32), human(lt->recv[k], d, 32));
  }
  for (size_t k = lt->start[l]; k < lt->start[l + 1]; k++) {
    const sh_step *st = &p->steps[lt->order[k]];
    if (st->kind != SH_COMM || st->comm == COMM_LOCAL_COPY) continue;
    fprintf(out, "  %-14s ranks {", sh_comm_name(st->comm));
    for (int i = 0; i < st->nranks; i++) fprintf(out, "%s%d", i ? "," : "", st->ranks[i]);
    fprintf(out, "}  %lld elems, %s sent by rank %d\n", (long long)st->elems, human(st->bytes_out[0], a, 32), st->ranks[0]);
  }
}

/* the memory plan's totals per rank */
static void print_totals(const sh_program *p, FILE *out) {
  const ir_module *m = p->global;
  char a[32], b[32], c[32], d[32], e[32];
  fprintf(out, "\ntotals per step (%s)\n  %-5s %12s %12s %14s %12s %12s\n",
          m->n_forward_ops ? "forward and backward" : "forward", "rank", "params", "inputs", "peak activ.", "sent",
          "received");
  int64_t tsent = 0;
  for (int32_t r = 0; r < p->world; r++) {
    const sh_rank_mem *mm = &p->mem[r];
    fprintf(out, "  %-5d %12s %12s %14s %12s %12s\n", r, human(mm->param_bytes, a, 32), human(mm->input_bytes, b, 32),
            human(mm->arena_bytes, c, 32), human(mm->bytes_sent, d, 32), human(mm->bytes_received, e, 32));
    tsent += mm->bytes_sent;
  }
  fprintf(out, "  all ranks: %s sent\n", human(tsent, a, 32));
}

/* recomputation: which layers, and the transfers it repeats */
static void print_recompute(const sh_program *p, FILE *out) {
  const ir_module *m = p->global;
  char a[32];
  int nrc = 0;
  int64_t rbytes = 0;
  for (size_t l = 0; l < m->n_layers; l++) nrc += p->placements[l].recompute;
  for (size_t s = 0; s < p->n_steps; s++) {
    const sh_step *st = &p->steps[s];
    if (st->kind == SH_COMM && st->why && !strncmp(st->why, "recompute:", 10))
      for (int i = 0; i < st->nranks; i++) rbytes += st->bytes_out[i];
  }
  if (!nrc) return;
  fprintf(out, "recompute: %d layer%s (", nrc, nrc == 1 ? "" : "s");
  for (size_t l = 0, k = 0; l < m->n_layers; l++)
    if (p->placements[l].recompute) fprintf(out, "%s%s", k++ ? ", " : "", m->layers[l].name);
  fprintf(out, ") run their forward again before their backward: their activations are freed after the forward "
               "(in the peaks above), their kernels run twice and their transfers send %s more (in the totals)\n",
          human(rbytes, a, 32));
}

void sh_print_report(const sh_program *p, FILE *out) {
  const ir_module *m = p->global;
  int32_t W = p->world;
  size_t nl = m->n_layers + 1; /* slot nl-1: model level */
  int64_t *live = live_bytes(p);
  layer_tables lt = {.nl = nl, .W = W};
  lt.params = calloc(nl * (size_t)W, sizeof *lt.params);
  lt.peak = calloc(nl * (size_t)W, sizeof *lt.peak);
  lt.sent = calloc(nl * (size_t)W, sizeof *lt.sent);
  lt.recv = calloc(nl * (size_t)W, sizeof *lt.recv);
  lt.start = calloc(nl + 1, sizeof *lt.start);
  lt.order = calloc(p->n_steps ? p->n_steps : 1, sizeof *lt.order);
  if (live && lt.params && lt.peak && lt.sent && lt.recv && lt.start && lt.order) {
    bucket_steps(p, &lt);
    tally_steps(p, live, &lt);
    fprintf(out, "report: model %s on %d ranks", m->name, W);
    if (m->active_plan >= 0) fprintf(out, ", plan %s", m->plans[m->active_plan].name);
    fputc('\n', out);
    for (size_t l = 0; l < nl; l++) print_layer(p, &lt, l, out);
    print_totals(p, out);
    if (m->n_forward_ops) print_recompute(p, out);
    for (size_t i = 0; i < p->n_notes; i++) fprintf(out, "matmul %s\n", p->notes[i]);
    if (m->n_forward_ops) print_grad_sync(p, out);
    if (m->n_forward_ops) sh_print_optimizer(p, out);
    if (p->pipelined) sh_print_pipeline(p, out);
  }
  free(lt.start);
  free(lt.order);
  free(live);
  free(lt.params);
  free(lt.peak);
  free(lt.sent);
  free(lt.recv);
}
