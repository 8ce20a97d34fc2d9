/* cg_fuse.c — elementwise fusion, which the forward families share: which steps join the kernel
 * of an earlier step (a chain of elementwise steps, each read only by the next, none an output),
 * and the text of such a chain in registers. The elementwise kernel is a chain alone
 * (cg_pointwise.c); a norm or softmax takes one as its tail (cg_rows.c); a GEMM asks whether its
 * bias add and GELU may fuse (cg_gemm.c), which cuBLASLt then does in its epilogue.
 *
 * The memory plan is made before fusion and knows nothing of it: a chain's kernel writes its
 * result when the last step of the chain would, but reads every operand of the chain in the same
 * threads, so output_safe() checks the bytes itself. */
#include "cg_fuse.h"

#include <stdio.h>

/* ---- which steps fuse ---------------------------------------------------------------------- */

/* The ops a chain may take: those cg_generate.c's table gives to cg_write_ew. act_grad (dy times
 * an activation's derivative) is elementwise too: it fuses into chains. */
static bool cg_is_ew(ir_opcode c) {
  return ir_op_is_unary_elementwise(c) || ir_op_is_binary_elementwise(c) || c == IR_ACT_GRAD;
}

/* The next step of this rank, or -1. Parameter and input initialisation steps run before everything else (the runtime hoists
 * them: they read nothing), so fusion looks past them. */
int32_t cg_next_step(gen *g, int32_t s) {
  for (size_t k = (size_t)s + 1; k < g->p->n_steps; k++) {
    const sh_step *st = &g->p->steps[k];
    if (st->kind == SH_COMPUTE && st->rank == g->rank && (st->op.code == IR_PARAM || st->op.code == IR_INPUT)) continue;
    if (st->kind == SH_COMPUTE && st->rank == g->rank) return (int32_t)k;
    if (st->kind == SH_COMM) {
      for (int i = 0; i < st->nranks; i++)
        if (st->ranks[i] == g->rank) return -1; /* a collective in between: stop fusing */
    }
  }
  return -1;
}

/* Can step `nx` be fused after the step producing `prev`? Same shape, prev read only here. */
bool cg_fusable(gen *g, int32_t prev_result, int32_t nx) {
  if (nx < 0 || g->m->steps[nx].kind != CG_NONE) return false; /* taken by a GEMM's epilogue */
  const sh_step *st = &g->p->steps[nx];
  if (!cg_is_ew(st->op.code)) return false;
  const sh_tensor *pt = &g->p->tensors[prev_result], *rt = &g->p->tensors[st->op.result];
  ntp_shape a = box_shape(&pt->box), b = box_shape(&rt->box);
  if (!shape_eq(&a, &b) || pt->dtype != rt->dtype || g->uses[prev_result] != 1) return false;
  if (pt->global >= 0 && pt->last_use == (int32_t)g->p->n_steps) return false; /* an output piece */
  bool reads = false;
  for (int a2 = 0; a2 < st->op.nargs; a2++) reads |= st->op.args[a2] == prev_result;
  return reads;
}

/* May the kernel of chain[0..n) store its result in tensor out? The kernel reads every memory
 * operand of the chain while it writes out, but the memory plan frees an operand after its
 * own step, not knowing that fusion moved the write later: out may lie over an operand of an
 * earlier step of the chain. Only an exact alias read at the element being written (same
 * place, same shape: each thread reads its element before writing it) is safe; any other
 * overlap is a race between threads and blocks. */
static bool output_safe(gen *g, const int32_t *chain, int n, int32_t out) {
  const sh_tensor *o = &g->p->tensors[out];
  ntp_shape os = box_shape(&o->box);
  for (int k = 0; k < n; k++) {
    const sh_step *st = &g->p->steps[chain[k]];
    for (int a = 0; a < st->op.nargs; a++) {
      int32_t t = st->op.args[a];
      if (k > 0 && t == g->p->steps[chain[k - 1]].op.result) continue; /* a register */
      if (!cg_overlap(g, t, out)) continue;
      const sh_tensor *x = &g->p->tensors[t];
      ntp_shape xs = box_shape(&x->box);
      if (x->offset != o->offset || x->dtype != o->dtype || !shape_eq(&xs, &os)) return false;
    }
  }
  return true;
}

/* The steps fused into the kernel of `first`: elementwise successors whose value is needed
 * nowhere else, while the result may be written where the memory plan put it. */
int cg_collect_chain(gen *g, int32_t first, int32_t *chain, int max) {
  int n = 0;
  chain[n++] = first;
  for (;;) {
    int32_t nx = cg_next_step(g, chain[n - 1]);
    if (n >= max || !cg_fusable(g, g->p->steps[chain[n - 1]].op.result, nx) ||
        !output_safe(g, chain, n, g->p->steps[nx].op.result))
      break;
    chain[n++] = nx;
  }
  for (int k = 1; k < n; k++) cg_mark_fused(g, chain[k]);
  return n;
}

/* ---- a chain's text ---------------------------------------------------------------------- */

/* Index of tensor t's element for output coordinates c0..c{n-1} (NumPy broadcasting, right-aligned). */
static void cg_bcast_index(gen *g, int32_t t, ntp_shape outs, char *buf, size_t cap) {
  ntp_shape s = cg_tshape(g, t);
  if (shape_eq(&s, &outs)) {
    snprintf(buf, cap, "i");
    return;
  }
  size_t n = (size_t)snprintf(buf, cap, "(0");
  int64_t stride = 1;
  for (int d = s.ndim - 1; d >= 0; d--) {
    int od = outs.ndim - s.ndim + d;
    if (s.dim[d] != 1 && n < cap) n += (size_t)snprintf(buf + n, cap - n, " + c%d * %lldll", od, (long long)stride);
    stride *= s.dim[d];
  }
  if (n < cap) snprintf(buf + n, cap - n, ")");
}

/* Output coordinate cD of flat index i, for each dim D in `mask` (the ones broadcast reads use). */
void cg_coords(gen *g, ntp_shape s, unsigned mask) {
  int64_t stride = 1;
  for (int d = s.ndim - 1; d >= 0; d--) {
    if (mask & (1u << d)) cg_out(g->m, "  i64 c%d = (i / %lldll) %% %lldll;\n", d, (long long)stride, (long long)s.dim[d]);
    stride *= s.dim[d];
  }
}

/* the derivative helper of the grad prelude (cg_generate.c) for act_grad of forward op `of` */
static const char *act_derivative(int32_t of) {
  switch (of) {
  case IR_GELU: return "ntp_d_gelu";
  case IR_RELU: return "ntp_d_relu";
  case IR_SILU: return "ntp_d_silu";
  case IR_SIGMOID: return "ntp_d_sigmoid_y";
  case IR_TANH: return "ntp_d_tanh_y";
  case IR_EXP: return "ntp_d_exp_y";
  default: return "ntp_d_neg";
  }
}

static const char *binop(ir_opcode c) {
  return c == IR_ADD ? "__fadd_rn" : c == IR_SUB ? "__fsub_rn" : c == IR_MUL ? "__fmul_rn" : "__fdiv_rn";
}

static void unary_expr(gen *g, ir_opcode c, const char *x) {
  switch (c) {
  case IR_NEG: cg_out(g->m, "-(%s)", x); break;
  case IR_GELU: cg_out(g->m, "ntp_gelu(%s)", x); break;
  case IR_RELU: cg_out(g->m, "ntp_relu(%s)", x); break;
  case IR_SILU: cg_out(g->m, "ntp_silu(%s)", x); break;
  case IR_SIGMOID: cg_out(g->m, "ntp_sigmoid(%s)", x); break;
  case IR_TANH: cg_out(g->m, "tanhf(%s)", x); break;
  default: cg_out(g->m, "expf(%s)", x); break;
  }
}

/* The tensor whose value step chain[k] finds in a register: the previous step's result,
 * or `reg` (a value computed before the chain, e.g. a norm's) for the first step. */
static int32_t in_register(gen *g, const int32_t *chain, int k, int32_t reg) {
  return k > 0 ? g->p->steps[chain[k - 1]].op.result : reg;
}

/* Emits the elementwise ops of steps chain[0..n) (float "vK" variables). */
void cg_ew_body(gen *g, const int32_t *chain, int n, ntp_shape os, int32_t reg) {
  char idx[512];
  for (int k = 0; k < n; k++) {
    const sh_step *st = &g->p->steps[chain[k]];
    int32_t r = st->op.result;
    char operand[2][600];
    for (int a = 0; a < st->op.nargs; a++) {
      int32_t t = st->op.args[a];
      if (t == in_register(g, chain, k, reg)) {
        snprintf(operand[a], sizeof operand[a], "v%d", t);
      } else {
        cg_bcast_index(g, t, os, idx, sizeof idx);
        const sh_tensor *ts = &g->p->tensors[t];
        if (ts->dtype == NTP_BF16 || ts->dtype == NTP_FP16)
          snprintf(operand[a], sizeof operand[a], "ld_%s(T%d, %s)", cg_dsuffix(ts->dtype), t, idx);
        else
          snprintf(operand[a], sizeof operand[a], "T%d[%s]", t, idx);
      }
    }
    cg_out(g->m, "  float v%d = rt_%s(", r, cg_dsuffix(g->p->tensors[r].dtype));
    if (st->op.code == IR_ACT_GRAD)
      cg_out(g->m, "__fmul_rn(%s, %s(%s))", operand[1], act_derivative(st->op.attr.grad.of), operand[0]);
    else if (st->op.nargs == 2) cg_out(g->m, "%s(%s, %s)", binop(st->op.code), operand[0], operand[1]);
    else unary_expr(g, st->op.code, operand[0]);
    cg_out(g->m, ");\n");
  }
}

/* The output dims that broadcast operands of the chain index by. */
unsigned cg_coord_mask(gen *g, const int32_t *chain, int n, ntp_shape os, int32_t reg) {
  unsigned mask = 0;
  for (int k = 0; k < n; k++) {
    const sh_step *st = &g->p->steps[chain[k]];
    for (int a = 0; a < st->op.nargs; a++) {
      if (st->op.args[a] == in_register(g, chain, k, reg)) continue;
      ntp_shape s = cg_tshape(g, st->op.args[a]);
      if (shape_eq(&s, &os)) continue;
      for (int d = 0; d < s.ndim; d++)
        if (s.dim[d] != 1) mask |= 1u << (os.ndim - s.ndim + d);
    }
  }
  return mask;
}

/* Every tensor the chain reads from memory, and its result, declared once each. */
void cg_declare_chain(gen *g, const int32_t *chain, int n, int32_t reg) {
  int32_t done[64];
  int nd = 0;
  for (int k = 0; k <= n; k++) {
    const sh_step *st = &g->p->steps[chain[k < n ? k : n - 1]];
    int nargs = k < n ? st->op.nargs : 1;
    for (int a = 0; a < nargs; a++) {
      int32_t t = k < n ? st->op.args[a] : st->op.result;
      if (k < n && t == in_register(g, chain, k, reg)) continue; /* a register, not memory */
      bool seen = false;
      for (int j = 0; j < nd; j++) seen |= done[j] == t;
      if (seen || nd == 64) continue;
      done[nd++] = t;
      cg_decl(g, t);
    }
  }
}
