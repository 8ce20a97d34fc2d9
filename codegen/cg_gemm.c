/* cg_gemm.c — the GEMMs: no kernel (cuBLASLt runs them from the step list's descriptors), but the
 * steps around a GEMM that cuBLASLt's epilogue can take, which then get no kernel either.
 *
 * Forward (cg_write_gemm, as the steps are written): a bias over the output columns and then GELU.
 *
 * Backward (cg_fold_backward_gemms, before any kernel is written, so that a taken step gets none):
 *
 *  - DGELU: a GEMM whose only reader is act_grad(x, ·) of a GELU multiplies by GELU'(x) in its
 *    epilogue, reading x (the GELU input the forward kept for the backward) as cuBLASLt's aux
 *    matrix; the GEMM then runs at the act_grad's step (its operands must still be there).
 *  - DGELU_BGRAD: and a sum_to of that result to its features (the bias gradient of the layer
 *    before the GELU) is written by the same GEMM.
 *  - BGRADA / BGRADB: a weight-gradient GEMM (trans_a) whose operand is the gradient g, or a
 *    reshape of it, writes sum_to(g) (that layer's bias gradient) too: the sum over the GEMM's k.
 *
 * A step moves in time when it is fused: the GEMM later (its operands must not be overwritten
 * in between), a sum_to earlier or later (its bytes must be free of every other live tensor in
 * between). The memory plan knows nothing of this, so each fold checks the tensors' def and
 * last_use steps instead of trusting the order. Rounding: the product is rounded once, after the
 * epilogue; in fp32 that is the unfused steps' arithmetic exactly, in bf16/fp16 DGELU skips
 * the rounding of the product before act_grad, so it is taken only in fp32 (docs/runtime.md).
 */
#include "cg_families.h"
#include "cg_fuse.h"

/* ---- forward ------------------------------------------------------------------------------- */

/* A GEMM for cuBLASLt, with what follows it folded into the epilogue where cuBLASLt can do
 * it: a bias over the output columns (x @ w + b) and then GELU. The chain may only end in a
 * tensor that shares no byte with the GEMM's operands or the bias (the memory plan, which
 * knows nothing of the fusion, could have placed it there: a GEMM reads all of both operands
 * while it writes). A batched right operand (attention-style) gets no epilogue. */
void cg_write_gemm(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t a = st->op.args[0], b = st->op.args[1], out = st->op.result;
  cg_step cs = {.kind = CG_GEMM, .kernel = -1, .epilogue = CG_EPI_NONE, .bias = -1, .aux = -1, .mm = s, .out = out};
  ntp_shape bs = cg_tshape(g, b), os = cg_tshape(g, out);
  int32_t nx = cg_next_step(g, s);
  if (bs.ndim == 2 && cg_fusable(g, out, nx) && g->p->steps[nx].op.code == IR_ADD) {
    const sh_step *ad = &g->p->steps[nx];
    int32_t other = ad->op.args[0] == out ? ad->op.args[1] : ad->op.args[0];
    ntp_shape vs = cg_tshape(g, other);
    int32_t res = ad->op.result;
    if (other != out && vs.ndim == 1 && vs.dim[0] == os.dim[os.ndim - 1] &&
        g->p->tensors[other].dtype == g->p->tensors[out].dtype && !cg_overlap(g, res, a) && !cg_overlap(g, res, b) &&
        !cg_overlap(g, res, other)) {
      cs.epilogue = CG_EPI_BIAS;
      cs.bias = other;
      cs.out = res;
      cg_mark_fused(g, nx);
    }
  }
  nx = cg_next_step(g, cs.out == out ? s : nx);
  if (bs.ndim == 2 && cg_fusable(g, cs.out, nx) && g->p->steps[nx].op.code == IR_GELU) {
    int32_t res = g->p->steps[nx].op.result;
    if (!cg_overlap(g, res, a) && !cg_overlap(g, res, b) && (cs.bias < 0 || !cg_overlap(g, res, cs.bias))) {
      cs.epilogue = cs.epilogue == CG_EPI_BIAS ? CG_EPI_GELU_BIAS : CG_EPI_GELU;
      cs.out = res;
      cg_mark_fused(g, nx);
    }
  }
  g->m->steps[s] = cs;
}

/* ---- backward ------------------------------------------------------------------------------ */

static const sh_tensor *tens(gen *g, int32_t t) { return &g->p->tensors[t]; }

static bool on_rank(gen *g, int32_t k) {
  const sh_step *st = &g->p->steps[k];
  return st->kind == SH_COMPUTE && st->rank == g->rank;
}

static bool reads(const sh_step *st, int32_t t) {
  if (st->kind == SH_COMPUTE) {
    for (int a = 0; a < st->op.nargs; a++)
      if (st->op.args[a] == t) return true;
    return false;
  }
  for (size_t x = 0; x < st->nxfers; x++)
    if (st->xfers[x].src == t) return true;
  return false;
}

/* The first step after `after` that reads t, or -1. */
static int32_t first_reader(gen *g, int32_t t, int32_t after) {
  for (size_t k = (size_t)after + 1; k < g->p->n_steps; k++)
    if (reads(&g->p->steps[k], t)) return (int32_t)k;
  return -1;
}

/* Do t's bytes stay as they are from step `from` through `to` (a read of t moved later than
 * the plan has it)? No other tensor over them may be defined in between. */
static bool bytes_kept(gen *g, int32_t t, int32_t from, int32_t to) {
  for (size_t u = 0; u < g->p->n_tensors; u++) {
    const sh_tensor *x = tens(g, (int32_t)u);
    if ((int32_t)u != t && x->def > from && x->def <= to && cg_overlap(g, (int32_t)u, t)) return false;
  }
  return true;
}

/* Are t's bytes free of every other tensor from step `from` through `to` (a write of t moved
 * away from its definition)? None over them may be live anywhere in between. */
static bool bytes_free(gen *g, int32_t t, int32_t from, int32_t to) {
  for (size_t u = 0; u < g->p->n_tensors; u++) {
    const sh_tensor *x = tens(g, (int32_t)u);
    if ((int32_t)u != t && x->def <= to && x->last_use >= from && cg_overlap(g, (int32_t)u, t)) return false;
  }
  return true;
}

static bool is_output_piece(gen *g, int32_t t) {
  return tens(g, t)->global >= 0 && tens(g, t)->last_use == (int32_t)g->p->n_steps;
}

/* A sum_to of one of `from[0..n)` to [features] on this rank, not yet taken: its step, or -1. */
static int32_t bias_grad_of(gen *g, const int32_t *from, int n, int64_t features, ntp_dtype dt) {
  for (size_t k = 0; k < g->p->n_steps; k++) {
    const sh_step *st = &g->p->steps[k];
    if (!on_rank(g, (int32_t)k) || st->op.code != IR_SUM_TO || g->m->steps[k].kind != CG_NONE) continue;
    ntp_shape ys = cg_tshape(g, st->op.result);
    bool mine = false;
    for (int i = 0; i < n; i++) mine |= st->op.args[0] == from[i];
    if (mine && ys.ndim == 1 && ys.dim[0] == features && tens(g, st->op.result)->dtype == dt) return (int32_t)k;
  }
  return -1;
}

/* DGELU (and DGELU_BGRAD) for the GEMM of step s: see the top of the file. */
static bool fold_dgelu(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t a = st->op.args[0], b = st->op.args[1], o = st->op.result;
  if (g->uses[o] != 1 || is_output_piece(g, o) || tens(g, o)->dtype != NTP_FP32) return false;
  int32_t R = first_reader(g, o, s);
  if (R < 0 || !on_rank(g, R) || g->m->steps[R].kind != CG_NONE) return false;
  const ir_op *ag = &g->p->steps[R].op;
  if (ag->code != IR_ACT_GRAD || ag->attr.grad.of != IR_GELU || ag->args[1] != o || ag->args[0] == o) return false;
  int32_t x = ag->args[0], r = ag->result;
  ntp_shape os = cg_tshape(g, o), xs = cg_tshape(g, x);
  int64_t N = os.dim[os.ndim - 1];
  /* cuBLASLt: the aux ld (x's row length, D's rows) a multiple of 8, aux and D of one type */
  if (!shape_eq(&os, &xs) || N % 8 != 0 || tens(g, x)->dtype != tens(g, o)->dtype || tens(g, r)->dtype != tens(g, o)->dtype)
    return false;
  /* the GEMM runs at step R: its operands kept until then; what it writes overlaps nothing it reads */
  if (!bytes_kept(g, a, s, R) || !bytes_kept(g, b, s, R) || cg_overlap(g, r, a) || cg_overlap(g, r, b) ||
      cg_overlap(g, r, x))
    return false;
  cg_step cs = {.kind = CG_GEMM, .kernel = -1, .epilogue = CG_EPI_DGELU, .bias = -1, .aux = x, .mm = s, .out = r};
  int32_t U = bias_grad_of(g, &r, 1, N, tens(g, r)->dtype);
  if (U > R) {
    int32_t db = g->p->steps[U].op.result;
    if (bytes_free(g, db, R, U) && !cg_overlap(g, db, a) && !cg_overlap(g, db, b) && !cg_overlap(g, db, x) &&
        !cg_overlap(g, db, r)) {
      cs.epilogue = CG_EPI_DGELU_BGRAD;
      cs.bias = db;
      cg_mark_fused(g, U);
    }
  }
  cg_mark_fused(g, s);
  g->m->steps[R] = cs;
  return true;
}

/* BGRADB / BGRADA for the weight-gradient GEMM of step s (trans_a): see the top of the file. */
static bool fold_bgrad(gen *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  int32_t a = st->op.args[0], b = st->op.args[1], o = st->op.result;
  ntp_shape as = cg_tshape(g, a), bs = cg_tshape(g, b);
  if (!st->op.attr.mm.trans_a || as.ndim != 2 || bs.ndim != 2) return false;
  /* cuBLASLt's B is the IR's a (op T: reduced over its rows, the k); its A is the IR's b when
   * not transposed (op N: likewise) */
  for (int which = 0; which < 2; which++) {
    int32_t t = which == 0 ? a : b;
    if (which == 1 && st->op.attr.mm.trans_b) break;
    int32_t from[2] = {t, t};
    int32_t d = tens(g, t)->def;
    if (d >= 0 && on_rank(g, d) && g->p->steps[d].op.code == IR_RESHAPE) from[1] = g->p->steps[d].op.args[0];
    ntp_shape ts = cg_tshape(g, t);
    ntp_dtype dt = tens(g, o)->dtype;
    if (tens(g, t)->dtype != dt) continue;
    int32_t U = bias_grad_of(g, from, 2, ts.dim[1], dt);
    if (U < 0) continue;
    int32_t db = g->p->steps[U].op.result, lo = U < s ? U : s, hi = U < s ? s : U;
    bool read_between = false; /* written at s: nothing may read it before */
    for (int32_t k = U + 1; k <= s; k++) read_between |= reads(&g->p->steps[k], db);
    if (read_between || !bytes_free(g, db, lo, hi) || cg_overlap(g, db, a) || cg_overlap(g, db, b) ||
        cg_overlap(g, db, o))
      continue;
    cg_mark_fused(g, U);
    g->m->steps[s] = (cg_step){.kind = CG_GEMM, .kernel = -1, .epilogue = which == 0 ? CG_EPI_BGRADB : CG_EPI_BGRADA,
                               .bias = db, .aux = -1, .mm = s, .out = o};
    return true;
  }
  return false;
}

void cg_fold_backward_gemms(gen *g) {
  for (size_t s = 0; s < g->p->n_steps; s++) {
    const sh_step *st = &g->p->steps[s];
    if (!on_rank(g, (int32_t)s) || st->op.code != IR_MATMUL || g->m->steps[s].kind != CG_NONE) continue;
    ntp_shape as = cg_tshape(g, st->op.args[0]), bs = cg_tshape(g, st->op.args[1]);
    if (bs.ndim != 2 || (st->op.attr.mm.trans_a && as.ndim != 2)) continue; /* a batched GEMM: no epilogue */
    if (!fold_dgelu(g, (int32_t)s)) fold_bgrad(g, (int32_t)s);
  }
}
