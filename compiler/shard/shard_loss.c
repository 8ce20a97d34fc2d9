/* shard_loss.c — cross-entropy without gathering the logits (Megatron's vocabulary-parallel
 * cross-entropy, for any groups, shares and uneven splits).
 *
 * The logits come from a column-parallel head: each rank of a group holds the group's rows for
 * a range of the vocabulary. The rows split into blocks whose pieces tile the vocabulary (one
 * block per group; replicas holding the same rows give one block, the first that tiles). Then:
 *   1. each rank of a block: ce_stats of its piece — per row the max, the sum of exponentials
 *      relative to it, and the target's logit where its range holds the target ([R, 4]);
 *   2. the block's stats gathered to its first rank ([R, 4t]: 16 bytes per row and rank, where
 *      the logits are 4 V bytes per row), and ce_rows there: the block's sum over its counted
 *      rows of logsumexp - target logit, and their count ([1, 2]);
 *   3. the blocks' parts gathered to one rank, and ce_mean: the loss.
 * The backward is the program's own (shard_grad.c), rule by rule: ce_mean's spreads the loss's
 * gradient over the count, ce_rows' gives each rank's sum its share of the softmax, ce_stats'
 * turns that into (softmax - onehot) on the rank's own logits. No logit ever moves.
 * Replicas that split the rows (data parallel, tp 1) make blocks of one rank each: only their
 * parts move. When the pieces do not tile the vocabulary, or one rank holds all the logits, the op
 * is left to `follow` (the logits gathered where the loss is computed). */
#include <stdlib.h>
#include <string.h>

#include "shard_internal.h"
#include "shard_lower.h"

typedef struct loss_block {
  ntp_box rows;     /* the logits' box without its last dim */
  int32_t *pieces;  /* indexes into the home list, in vocabulary order */
  int t;
  int32_t mb;       /* its micro-batch (pipelined programs), else -1 */
} loss_block;

/* Micro-batches: the loss's gradient on each row block's part is 1 / (rows counted in the
 * whole batch), which the targets alone give. Each block's first rank counts its rows; the
 * counts are gathered to every such rank and each makes the seed of its parts (shard_grad.c
 * starts the backward there): no micro-batch's backward waits for another's forward. */
static void seed_parts(shard_lowering *L, const ir_op *op, const loss_block *bl, size_t nb, const rank_box *rb,
                       const int32_t *parts) {
  sh_program *p = shard_lowering_program(L);
  int32_t tg = op->args[1];
  int32_t *cnt = malloc((nb + 1) * sizeof *cnt), *ranks = malloc((nb + 1) * sizeof *ranks);
  sh_xfer *xf = malloc((nb * nb + 1) * sizeof *xf);
  if (!cnt || !ranks || !xf) ntp_out_of_memory();
  size_t nr = 0, nx = 0;
  for (size_t j = 0; j < nb; j++) {
    int32_t first = rb[bl[j].pieces[0]].rank;
    int32_t t = shard_ensure(L, tg, first, bl[j].rows);
    ntp_box cb = {2, {(int64_t)j, 0}, {(int64_t)j + 1, 2}};
    cnt[j] = shard_temp_box(L, first, IR_CE_COUNT, &t, 1, op, cb, NTP_FP32);
    size_t k = 0;
    while (k < nr && ranks[k] != first) k++;
    if (k == nr) ranks[nr++] = first;
  }
  ntp_box all = {2, {0, 0}, {(int64_t)nb, 2}};
  int32_t *C = malloc((nr + 1) * sizeof *C), *seed = malloc((nr + 1) * sizeof *seed);
  if (!C || !seed) ntp_out_of_memory();
  for (size_t k = 0; k < nr; k++) {
    C[k] = shard_new_temp(L, ranks[k], all, NTP_FP32);
    for (size_t j = 0; j < nb; j++) xf[nx++] = (sh_xfer){.src = cnt[j], .dst = C[k], .box = p->tensors[cnt[j]].box};
  }
  shard_backward_comm(L, COMM_SEND_RECV, xf, nx, "loss: every row block's count of target rows, to every block");
  ntp_box one = {2, {0, 0}, {1, 2}};
  for (size_t k = 0; k < nr; k++) seed[k] = shard_temp_box(L, ranks[k], IR_CE_SEED, &C[k], 1, NULL, one, NTP_FP32);
  for (size_t j = 0; j < nb; j++) {
    size_t k = 0;
    while (ranks[k] != rb[bl[j].pieces[0]].rank) k++;
    /* the seed in the part's own coordinates (the part's box is row j of the gathered parts) */
    int32_t g = shard_temp_box(L, ranks[k], IR_RESHAPE, &seed[k], 1, NULL, p->tensors[parts[j]].box, NTP_FP32);
    shard_add_seed(L, parts[j], g);
  }
  free(cnt);
  free(ranks);
  free(xf);
  free(C);
  free(seed);
}

static ntp_box row_box(const ntp_box *b) {
  ntp_box r = *b;
  r.ndim = b->ndim - 1;
  return r;
}

/* A chain of pieces with row box `rows` covering [0, V) of the vocabulary, lowest ranges first;
 * the number of pieces, or 0 when none tiles it. */
static int tile(const rank_box *rb, size_t n, const ntp_box *rows, int64_t V, int32_t *out) {
  int d = rows->ndim, t = 0;
  for (int64_t at = 0; at < V;) {
    size_t k = 0;
    for (; k < n; k++) {
      ntp_box r = row_box(&rb[k].box);
      if (box_eq(&r, rows) && rb[k].box.lo[d] == at && rb[k].box.hi[d] > at) break;
    }
    if (k == n) return 0;
    out[t++] = (int32_t)k;
    at = rb[k].box.hi[d];
  }
  return t;
}

bool shard_lower_loss(shard_lowering *L, const ir_op *op) {
  const ir_module *m = shard_module(L);
  int32_t lg = op->args[0], tg = op->args[1];
  ntp_shape ls = m->values[lg].shape;
  int nd = ls.ndim;
  int64_t V = nd ? ls.dim[nd - 1] : 0, total = 1;
  for (int d = 0; d + 1 < nd; d++) total *= ls.dim[d];
  if (nd < 2 || V < 2) return false;
  size_t cap = shard_home_count(L, lg) + 4 * (size_t)shard_lowering_program(L)->world + 4;
  rank_box *rb = malloc(cap * sizeof *rb);
  loss_block *bl = calloc(cap, sizeof *bl);
  int32_t *chain = malloc(cap * sizeof *chain);
  if (!rb || !bl || !chain) ntp_out_of_memory();
  size_t n = shard_homes(L, lg, rb), nb = 0;
  int64_t covered = 0;
  bool split = false;
  for (size_t i = 0; i < n; i++) { /* blocks in the order of their first piece, disjoint rows */
    ntp_box rows = row_box(&rb[i].box);
    bool taken = false;
    for (size_t j = 0; j < nb && !taken; j++) {
      ntp_box x;
      taken = box_intersect(&bl[j].rows, &rows, &x) && box_volume(&x) > 0;
    }
    if (taken) continue;
    int t = tile(rb, n, &rows, V, chain);
    if (!t) continue;
    int32_t *c = malloc((size_t)t * sizeof *c);
    if (!c) ntp_out_of_memory();
    memcpy(c, chain, (size_t)t * sizeof *c);
    bl[nb++] = (loss_block){.rows = rows, .pieces = c, .t = t, .mb = shard_home_mb(L, lg, (size_t)chain[0])};
    covered += box_volume(&rows);
    split |= t > 1;
  }
  /* one block of one piece: the logits are whole on one rank, and `follow` computes the loss there */
  bool micro = shard_micro_batches(L) > 0; /* pipelined: always by blocks, each in its micro-batch */
  bool ok = covered == total && (split || nb > 1 || micro);
  if (ok) {
    sh_program *p = shard_lowering_program(L);
    int32_t home = rb[bl[0].pieces[0]].rank;
    int32_t *parts = malloc((nb + 1) * sizeof *parts);
    sh_xfer *xf = malloc((cap + nb + 1) * sizeof *xf);
    if (!parts || !xf) ntp_out_of_memory();
    for (size_t j = 0; j < nb; j++) {
      const loss_block *b = &bl[j];
      int64_t R = box_volume(&b->rows);
      int32_t first = rb[b->pieces[0]].rank;
      if (micro) shard_set_mb(L, b->mb);
      ntp_box gbox = {2, {0, 0}, {R, 4 * (int64_t)b->t}};
      int32_t G = shard_new_temp(L, first, gbox, NTP_FP32);
      for (int k = 0; k < b->t; k++) {
        const rank_box *pc = &rb[b->pieces[k]];
        ir_op st = *op;
        st.attr.ce.lo = pc->box.lo[nd - 1];
        int32_t args[2] = {shard_ensure(L, lg, pc->rank, pc->box), shard_ensure(L, tg, pc->rank, b->rows)};
        ntp_box sbox = {2, {0, 4 * (int64_t)k}, {R, 4 * (int64_t)k + 4}};
        int32_t stats = shard_temp_box(L, pc->rank, IR_CE_STATS, args, 2, &st, sbox, NTP_FP32);
        xf[k] = (sh_xfer){.src = stats, .dst = G, .box = sbox};
      }
      shard_backward_comm(L, COMM_SEND_RECV, xf, (size_t)b->t,
                          "loss: the vocabulary shards' row statistics to the block's first rank");
      int32_t args[2] = {G, shard_ensure(L, tg, first, b->rows)};
      ntp_box pbox = {2, {(int64_t)j, 0}, {(int64_t)j + 1, 2}};
      parts[j] = shard_temp_box(L, first, IR_CE_ROWS, args, 2, op, pbox, NTP_FP32);
    }
    if (micro) { /* the seeds, and the total (no micro-batch's: it waits for all) */
      shard_set_mb(L, -1);
      seed_parts(L, op, bl, nb, rb, parts);
    }
    ntp_box all = {2, {0, 0}, {(int64_t)nb, 2}};
    int32_t P = shard_new_temp(L, home, all, NTP_FP32);
    for (size_t j = 0; j < nb; j++) xf[j] = (sh_xfer){.src = parts[j], .dst = P, .box = p->tensors[parts[j]].box};
    shard_backward_comm(L, COMM_SEND_RECV, xf, nb, "loss: the row blocks' sums to one rank");
    ntp_shape scalar = {0};
    int32_t loss = shard_compute(L, home, IR_CE_MEAN, &P, 1, op, op->result, box_full(&scalar), NTP_FP32);
    shard_add_home(L, op->result, loss);
    free(parts);
    free(xf);
  }
  for (size_t j = 0; j < nb; j++) free(bl[j].pieces);
  free(rb);
  free(bl);
  free(chain);
  return ok;
}
